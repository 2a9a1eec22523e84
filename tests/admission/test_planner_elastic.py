"""Planner rule 7, elastic reservations, table by table: who gets one, what it reserves, where the watermark
stops admissions; everything else reserves its whole limit as before."""

from __future__ import annotations

import pytest

from gateway.admission import Admit, LedgerSnapshot, Policy, PoolSpec, RequestCost, Wait
from gateway.admission.planner import plan
from gateway.domain import BackendKind

UNIFIED = PoolSpec.unified_pool("cpp", "m", pool_tokens=2048, slots=4)
SPLIT = PoolSpec.split_pool("cpp", "m", BackendKind.LLAMA_SERVER, slot_ctx_tokens=2048, slots=4)
ON = Policy(elastic_watermark=0.9, elastic_floor_tokens=128)
OFF = Policy()


def chat(expected: int | None, *, limit: int | None = None, sequences: int = 1,
         batch: tuple[int, ...] = ()) -> RequestCost:
    prompt = sum(batch) if batch else 500
    return RequestCost(prompt, True, limit, None, sequences=sequences, batch_prompt_tokens=batch,
                       expected_output_tokens=expected)


@pytest.mark.parametrize(("name", "cost", "pool", "policy", "reserve", "limit"), [
    ("cold: the whole limit", chat(None), UNIFIED, ON, 1524, None),
    ("warm: prompt + p95", chat(300), UNIFIED, ON, 800, 1524),
    ("warm, short answers: the floor", chat(20), UNIFIED, ON, 628, 1524),
    ("the client's limit below the expectation", chat(300, limit=100), UNIFIED, ON, 600, None),
    ("expectation above the limit: fixed", chat(1500), UNIFIED, ON, 1524, None),
    ("elastic off", chat(300), UNIFIED, OFF, 1524, None),
    ("a split pool: its slot is its own", chat(300), SPLIT, ON, 2048, None),
    ("n = 2 completions: fixed", chat(300, sequences=2), UNIFIED, ON, 2048, None),
    ("a batch: fixed", chat(300, batch=(200, 300)), UNIFIED, ON, 2048, None),
])
def test_who_reserves_what(name: str, cost: RequestCost, pool: PoolSpec, policy: Policy, reserve: int,
                           limit: int | None) -> None:
    decision = plan(cost, pool, LedgerSnapshot(), policy)
    print(f"{name:45} -> {decision}")
    assert isinstance(decision, Admit)
    assert (decision.reserve_tokens, decision.limit_tokens) == (reserve, limit)
    if limit is not None:
        assert any("elastic reservation" in note for note in decision.notes)


def test_the_limit_the_backend_is_told_is_the_same_elastic_or_not() -> None:
    warm = plan(chat(300), UNIFIED, LedgerSnapshot(), ON)
    cold = plan(chat(None), UNIFIED, LedgerSnapshot(), ON)
    assert isinstance(warm, Admit) and isinstance(cold, Admit)
    assert warm.rewrites == cold.rewrites


@pytest.mark.parametrize(("reserved", "admitted"), [(0, True), (1000, True), (1043, True), (1044, False),
                                                    (1800, False)])
def test_elastic_requests_are_admitted_up_to_the_watermark(reserved: int, admitted: bool) -> None:
    """90% of 2,048 is 1,843: a request of 800 fits beside 1,043 reserved, not beside 1,044."""
    decision = plan(chat(300), UNIFIED, LedgerSnapshot(1 if reserved else 0, reserved), ON)
    assert isinstance(decision, Admit if admitted else Wait), decision
    if not admitted and reserved + 800 <= 2048:  # past the pool itself, the pool's own words
        assert isinstance(decision, Wait) and "admit_watermark 0.9" in decision.reason


def test_a_fixed_request_still_fills_the_pool_to_the_last_cell() -> None:
    assert isinstance(plan(chat(None, limit=24), UNIFIED, LedgerSnapshot(1, 1524), ON), Admit)  # 524 of 524
    assert isinstance(plan(chat(None, limit=25), UNIFIED, LedgerSnapshot(1, 1524), ON), Wait)
