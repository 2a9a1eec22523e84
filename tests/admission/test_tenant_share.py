"""Issue 14, point 2: a tenant's share of each KV pool (``max_pool_share``), on top of ``max_active``.

The matrix: share (a fraction, or tokens) x pool (unified, split) x what the tenant already holds (none, some, near its
share) x request (small, medium, large) -> admit, wait (scope "tenant") or reject (400 ``tenant_share_exceeded``).
Then the edges: kvgate's own output limit stays within the share, ``n`` completions count together, other tenants'
tokens never count, and in the waiting room a tenant at its share never blocks anyone else.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.admission import (
    AdmissionRejected,
    Admit,
    Ledger,
    LedgerSnapshot,
    Policy,
    PoolSpec,
    Reject,
    RequestCost,
    Wait,
    WaitingRoom,
    plan,
)
from gateway.admission.planner import TENANT_SHARE_EXCEEDED, tenant_share_tokens
from gateway.admission.tenant_keys import TenantDirectory
from gateway.config.settings import Settings, TenantSettings
from gateway.domain import BackendKind
from tests.support.clock import FakeClock

UNIFIED = PoolSpec.unified_pool("cpp", "qwen2.5:7b", pool_tokens=32_768, slots=8)
SPLIT = PoolSpec.split_pool("ollama", "llama3.1:8b", BackendKind.LLAMA_SERVER, slot_ctx_tokens=8192, slots=4)
POOLS = {"unified": UNIFIED, "split": SPLIT}  # both 32,768 tokens, so one share means 4,096 tokens in each
SHARES: dict[str, float | int] = {"fraction 0.125": 0.125, "tokens 4096": 4096}
HOLDS = {"none": 0, "some": 2000, "near-cap": 3900}  # tokens the tenant 'ci' already holds, as one sequence
REQUESTS = {"small": (100, 100), "medium": (500, 2500), "large": (1000, 4000)}  # (prompt, max output) tokens

EXPECTED = {  # by (hold, request); the same for every share and pool: 0.125 of 32,768 is 4,096 tokens
    ("none", "small"): "admit", ("none", "medium"): "admit", ("none", "large"): "reject",
    ("some", "small"): "admit", ("some", "medium"): "wait", ("some", "large"): "reject",
    ("near-cap", "small"): "wait", ("near-cap", "medium"): "wait", ("near-cap", "large"): "reject",
}


def snapshot(ci_tokens: int, *, web_tokens: int = 1000) -> LedgerSnapshot:
    """'ci' holds ``ci_tokens`` in one sequence (if any), 'web' holds ``web_tokens``: the pool itself has room."""
    active = {"web": 1} | ({"ci": 1} if ci_tokens else {})
    tokens = {"web": web_tokens} | ({"ci": ci_tokens} if ci_tokens else {})
    return LedgerSnapshot(sum(active.values()), sum(tokens.values()), active, tokens)


def outcome(decision: Admit | Wait | Reject) -> str:
    return {Admit: "admit", Wait: "wait", Reject: "reject"}[type(decision)]


def test_the_matrix() -> None:
    rows: list[tuple[str, ...]] = []
    for share_name, share in SHARES.items():
        policy = Policy(per_tenant_max_share=share)
        for pool_name, pool in POOLS.items():
            for hold_name, held in HOLDS.items():
                for request_name, (prompt, output) in REQUESTS.items():
                    decision = plan(RequestCost(prompt, True, output, None, "ci"), pool, snapshot(held), policy)
                    got = outcome(decision)
                    rows.append((share_name, pool_name, f"{hold_name} ({held:,})",
                                 f"{request_name} ({prompt + output:,})", got))
                    assert got == EXPECTED[hold_name, request_name], (rows[-1], decision)
                    if isinstance(decision, Wait):
                        assert decision.scope == "tenant"
                        assert f"tenant 'ci' holds {held:,} of its 4,096 tokens" in decision.reason
                        assert f"this request needs {prompt + output:,}" in decision.reason
                    if isinstance(decision, Reject):
                        assert (decision.status, decision.code) == (400, TENANT_SHARE_EXCEEDED)
                        assert f"needs {prompt + output:,} tokens" in decision.message
                        assert "tenant 'ci' may hold at most 4,096 tokens" in decision.message
    header = ("share", "pool", "ci holds", "request", "decision")
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    print()
    for row in (header, *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


@pytest.mark.parametrize(("share", "expected"), [
    (0.125, "4,096 tokens (max_pool_share 0.125 of 32,768)"), (4096, "4,096 tokens (max_pool_share)"),
])
def test_the_messages_name_the_share_as_configured(share: float | int, expected: str) -> None:
    waited = plan(RequestCost(100, True, 100, None, "ci"), UNIFIED, snapshot(3900), Policy(per_tenant_max_share=share))
    rejected = plan(RequestCost(1000, True, 4000, None, "ci"), UNIFIED, snapshot(0), Policy(per_tenant_max_share=share))
    assert isinstance(waited, Wait) and expected in waited.reason
    assert isinstance(rejected, Reject) and expected in rejected.message
    print(f"\nwait:   {waited.reason}\nreject: {rejected.message}")


@pytest.mark.parametrize(("share", "pool", "tokens"), [
    (None, UNIFIED, None), (0.125, UNIFIED, 4096), (0.1, UNIFIED, 3276), (1.0, SPLIT, 32_768), (1, SPLIT, 1),
    (100_000, SPLIT, 100_000),  # more than the pool: the pool's own budget is the tighter limit
])
def test_a_share_in_tokens_of_each_pool(share: float | int | None, pool: PoolSpec, tokens: int | None) -> None:
    assert tenant_share_tokens(share, pool) == tokens


@pytest.mark.parametrize("pool", POOLS.values(), ids=POOLS.keys())
def test_an_unset_output_limit_is_chosen_within_the_share(pool: PoolSpec) -> None:
    """kvgate's own choice of output limit never makes a request too big for its tenant's share."""
    decision = plan(RequestCost(100, True, None, None, "ci"), pool, LedgerSnapshot(), Policy(per_tenant_max_share=0.1))
    assert isinstance(decision, Admit) and decision.reserve_tokens == 3276  # 0.1 of 32,768, rounded down
    assert decision.rewrites.max_output_tokens == 3176
    assert "tenant 'ci's share of the pool" in decision.notes[-1]


def test_n_completions_count_together_against_the_share() -> None:
    policy = Policy(per_tenant_max_share=4096)
    two = plan(RequestCost(1000, True, 1000, None, "ci", sequences=2), UNIFIED, snapshot(1000), policy)
    three = plan(RequestCost(1000, True, 1000, None, "ci", sequences=3), UNIFIED, LedgerSnapshot(), policy)
    assert isinstance(two, Wait) and two.scope == "tenant"  # 1,000 + 4,000 > 4,096
    assert isinstance(three, Reject)
    assert "6,000 tokens: (prompt 1,000 tokens + max output 1,000) x 3 completions" in three.message


def test_other_tenants_tokens_never_count() -> None:
    busy = snapshot(0, web_tokens=20_000)
    decision = plan(RequestCost(2000, True, 2000, None, "ci"), UNIFIED, busy, Policy(per_tenant_max_share=0.125))
    assert isinstance(decision, Admit)


def test_the_pool_still_limits_a_tenant_within_its_share() -> None:
    full = snapshot(0, web_tokens=32_000)
    decision = plan(RequestCost(500, True, 500, None, "ci"), UNIFIED, full, Policy(per_tenant_max_share=0.5))
    assert isinstance(decision, Wait) and decision.scope == "pool"


def test_max_active_is_asked_first_and_both_caps_hold() -> None:
    policy = Policy(per_tenant_max_active=1, per_tenant_max_share=0.125)
    decision = plan(RequestCost(100, True, 100, None, "ci"), UNIFIED, snapshot(3900), policy)
    assert isinstance(decision, Wait) and "1 of 1 allowed active requests" in decision.reason


@pytest.mark.parametrize("bad", [0, -1, 0.0, 1.5, -0.5, True, "0.5"])
def test_a_share_that_is_neither_a_fraction_nor_tokens_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="per_tenant_max_share"):
        Policy(per_tenant_max_share=bad)
    with pytest.raises(ValidationError, match="max_pool_share"):
        TenantSettings(max_pool_share=bad)


@pytest.mark.parametrize("good", [1.0, 0.25, 1, 8192])
def test_a_tenants_share_reaches_its_tenant(good: float | int) -> None:
    settings = Settings.model_validate({"tenants": {"ci": {"api_keys": ["ci-key"], "max_pool_share": good}}})
    tenant = TenantDirectory(settings).identify({"X-Api-Key": "ci-key"})
    assert tenant.max_pool_share == good and type(tenant.max_pool_share) is type(good)


def test_the_ledger_keeps_each_tenants_tokens() -> None:
    ledger = Ledger()
    a = ledger.reserve(UNIFIED.key, 1000, "ci")
    b = ledger.reserve(UNIFIED.key, 3000, "ci", sequences=2)
    c = ledger.reserve(UNIFIED.key, 500, "web")
    ledger.check_invariants()
    assert dict(ledger.snapshot(UNIFIED.key).per_tenant_tokens) == {"ci": 4000, "web": 500}
    ledger.release(b)
    ledger.release(b)
    ledger.check_invariants()
    assert dict(ledger.snapshot(UNIFIED.key).per_tenant_tokens) == {"ci": 1000, "web": 500}
    ledger.release(a)
    assert dict(ledger.snapshot(UNIFIED.key).per_tenant_tokens) == {"web": 500}
    ledger.release(c)
    assert ledger.snapshot(UNIFIED.key) == LedgerSnapshot()


# --- the waiting room -------------------------------------------------------------------------------------------


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("share", SHARES.values(), ids=SHARES.keys())
@pytest.mark.parametrize("pool", POOLS.values(), ids=POOLS.keys())
async def test_a_tenant_at_its_share_never_blocks_another_tenant(pool: PoolSpec, share: float | int) -> None:
    """ci fills its share and queues more; long after the overtake window, web's requests still go straight in,
    and ci's waiter goes in as soon as ci's own tokens come back."""
    clock = FakeClock()
    room = WaitingRoom(Ledger(), clock=clock)
    policy = Policy(per_tenant_max_share=share, overtake_window_s=1.0, queue_timeout_s=600.0)
    held = await room.acquire(pool.key, pool, RequestCost(1000, True, 3000, None, "ci"), policy)
    waiter = asyncio.create_task(room.acquire(pool.key, pool, RequestCost(100, True, 100, None, "ci"), policy))
    await _settle()
    assert not waiter.done() and room.queue_length(pool.key) == 1
    clock.advance(60.0)  # far past overtake_window_s: a waiter held back by the pool would now block everyone
    others = [await room.acquire(pool.key, pool, RequestCost(100, True, 100, None, "web"), policy) for _ in range(2)]
    (view,) = room.stats()[pool.key].waiters
    assert view.tenant == "ci" and "tenant 'ci' holds 4,000 of its 4,096 tokens" in view.reason
    assert not waiter.done()
    with pytest.raises(AdmissionRejected) as refused:  # alone over the share: refused at once, never queued
        await room.acquire(pool.key, pool, RequestCost(1000, True, 4000, None, "ci"), policy)
    assert (refused.value.status, refused.value.code) == (400, TENANT_SHARE_EXCEEDED)
    held.release()
    admitted = await asyncio.wait_for(waiter, 1.0)
    assert room.queue_length(pool.key) == 0
    for permit in (admitted, *others):
        permit.release()
    room.ledger.check_invariants()
    assert room.ledger.keys() == ()
