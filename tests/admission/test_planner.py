"""Table-driven checks of every planner rule, plus properties that hold for any input."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway
from gateway.admission import (
    Admit,
    Decision,
    LedgerSnapshot,
    Policy,
    PoolSpec,
    Reject,
    RequestCost,
    Rewrites,
    Wait,
    plan,
    reserved_prompt_tokens,
)
from gateway.domain import BackendKind

OLLAMA = PoolSpec.split_pool("gpu0", "llama3.1:8b", BackendKind.OLLAMA, slot_ctx_tokens=8192, slots=4)
SPLIT = PoolSpec.split_pool("gpu1", "qwen2.5:7b", BackendKind.LLAMA_SERVER, slot_ctx_tokens=4096, slots=2)
UNIFIED = PoolSpec.unified_pool("gpu1", "qwen2.5:7b", pool_tokens=32768, slots=4)
OPENAI = PoolSpec.split_pool("vllm", "gpt-x", BackendKind.OPENAI, slot_ctx_tokens=8192, slots=8)
EMPTY = LedgerSnapshot()
DEFAULT = Policy()
NO_CLAMP = Policy(clamp_output=False)
NO_PIN = Policy(pin_num_ctx=False)
CAP_2 = Policy(per_tenant_max_active=2)


def cost(
    prompt: int, *, exact: bool = True, out: int | None = 500, num_ctx: int | None = None, tenant: str = "default"
) -> RequestCost:
    return RequestCost(prompt, exact, out, num_ctx, tenant)


def busy(active: int, reserved_tokens: int = 0, **per_tenant: int) -> LedgerSnapshot:
    return LedgerSnapshot(active, reserved_tokens, per_tenant)


# (request, pool, snapshot, policy) -> (reserve_tokens, rewrites); notes are checked separately.
ADMITS = [
    pytest.param(cost(1000, num_ctx=8192), OLLAMA, EMPTY, DEFAULT, 1500, Rewrites(), id="exact-prompt-plus-limit"),
    pytest.param(cost(1000, exact=False), SPLIT, EMPTY, DEFAULT, 1600, Rewrites(), id="estimate-gets-10pct-margin"),
    pytest.param(cost(1001, exact=False), SPLIT, EMPTY, DEFAULT, 1102 + 500, Rewrites(), id="margin-rounds-up"),
    pytest.param(cost(1000, exact=False), SPLIT, EMPTY, Policy(estimate_margin=0), 1500, Rewrites(), id="no-margin"),
    pytest.param(cost(1000, out=None), SPLIT, EMPTY, DEFAULT, 4096, Rewrites(max_output_tokens=3096),
                 id="no-limit-split-gets-its-slot"),
    pytest.param(cost(3500, out=None), SPLIT, EMPTY, DEFAULT, 4096, Rewrites(max_output_tokens=596),
                 id="no-limit-fills-slot"),
    pytest.param(cost(1000, out=None), UNIFIED, EMPTY, DEFAULT, 8192, Rewrites(max_output_tokens=7192),
                 id="no-limit-unified-fair-share"),
    pytest.param(cost(7800, out=None), UNIFIED, EMPTY, DEFAULT, 8824, Rewrites(max_output_tokens=1024),
                 id="no-limit-unified-at-least-default"),
    pytest.param(cost(1000, out=None), UNIFIED, busy(3, 24576), DEFAULT, 8192, Rewrites(max_output_tokens=7192),
                 id="no-limit-unified-share-fits-beside-three"),
    pytest.param(cost(3000, out=0), SPLIT, EMPTY, DEFAULT, 3000, Rewrites(), id="zero-output"),
    pytest.param(cost(3000, out=1096), SPLIT, EMPTY, NO_CLAMP, 4096, Rewrites(), id="output-exactly-fills-slot"),
    pytest.param(
        cost(3000, out=2000), SPLIT, EMPTY, DEFAULT, 4096, Rewrites(max_output_tokens=1096), id="output-clamped"
    ),
    pytest.param(
        cost(2000, exact=False, out=3000),
        SPLIT,
        EMPTY,
        DEFAULT,
        4096,
        Rewrites(max_output_tokens=1896),
        id="clamp-counts-the-margin",
    ),
    # an estimate leans high: the output is never clamped below the floor (min(default_output_tokens, ctx / 4)),
    # and the reservation is at most the context
    pytest.param(cost(3000, exact=False, out=2000), SPLIT, EMPTY, DEFAULT, 4096, Rewrites(max_output_tokens=1024),
                 id="estimate-clamp-stops-at-the-floor"),
    pytest.param(cost(3000, exact=False, out=200), SPLIT, EMPTY, DEFAULT, 3500, Rewrites(),
                 id="estimate-small-limit-stands"),
    pytest.param(cost(3000, exact=False, out=2000), SPLIT, EMPTY, NO_CLAMP, 4096, Rewrites(),
                 id="estimate-no-clamp-limit-stands"),
    pytest.param(cost(2000, exact=False, out=3000), SPLIT, EMPTY, NO_CLAMP, 4096, Rewrites(),
                 id="estimate-no-clamp-never-refused"),
    pytest.param(cost(3600, exact=False, out=2000), SPLIT, EMPTY, Policy(default_output_tokens=256), 4096,
                 Rewrites(max_output_tokens=256), id="estimate-floor-is-at-most-the-default"),
    pytest.param(cost(9000, exact=False, out=None), SPLIT, EMPTY, Policy(estimate_is_final=True), 4096,
                 Rewrites(max_output_tokens=1024), id="final-estimate-over-the-context-is-forwarded"),
    pytest.param(cost(40000, exact=False, out=5000), UNIFIED, EMPTY, Policy(estimate_is_final=True), 32768,
                 Rewrites(max_output_tokens=1024), id="final-estimate-reserves-at-most-the-context"),
    pytest.param(cost(3000, exact=False, out=2000), SPLIT, EMPTY, Policy(per_tenant_max_share=1000), 4096,
                 Rewrites(max_output_tokens=1024), id="estimate-over-its-share-runs-alone"),
    pytest.param(cost(4095, out=None), SPLIT, EMPTY, DEFAULT, 4096, Rewrites(max_output_tokens=1),
                 id="longest-prompt-gets-one-token"),
    pytest.param(cost(3722, exact=False, out=None), SPLIT, EMPTY, DEFAULT, 4096, Rewrites(max_output_tokens=1024),
                 id="estimate-just-fits-gets-the-floor"),
    pytest.param(cost(1000), OLLAMA, EMPTY, DEFAULT, 1500, Rewrites(num_ctx=8192), id="ollama-pins-absent-num-ctx"),
    pytest.param(cost(1000, num_ctx=16384), OLLAMA, EMPTY, DEFAULT, 1500, Rewrites(num_ctx=8192), id="pin-larger"),
    pytest.param(cost(1000, num_ctx=2048), OLLAMA, EMPTY, DEFAULT, 1500, Rewrites(num_ctx=8192), id="pin-smaller"),
    pytest.param(cost(1000), OLLAMA, EMPTY, NO_PIN, 1500, Rewrites(), id="unpinned-absent-num-ctx"),
    pytest.param(cost(10000, num_ctx=16384), OLLAMA, EMPTY, NO_PIN, 10500, Rewrites(), id="unpinned-uses-its-ctx"),
    pytest.param(cost(1000, num_ctx=16384), SPLIT, EMPTY, DEFAULT, 1500, Rewrites(), id="llama-server-ignores-num-ctx"),
    pytest.param(cost(1000, num_ctx=16384), OPENAI, EMPTY, DEFAULT, 1500, Rewrites(), id="openai-ignores-num-ctx"),
    pytest.param(cost(1000), SPLIT, busy(1), DEFAULT, 1500, Rewrites(), id="split-free-slot"),
    pytest.param(cost(4000, out=0), SPLIT, busy(1, 10**9), DEFAULT, 4000, Rewrites(), id="split-ignores-pool-tokens"),
    pytest.param(cost(1500), UNIFIED, busy(3, 30768), DEFAULT, 2000, Rewrites(), id="unified-exactly-fills-pool"),
    pytest.param(cost(30000, out=None), UNIFIED, EMPTY, DEFAULT, 31024, Rewrites(max_output_tokens=1024),
                 id="unified-slot-is-whole-pool"),
    pytest.param(cost(10), SPLIT, busy(1, 0, ci=1), CAP_2, 510, Rewrites(), id="tenant-under-cap"),
    pytest.param(cost(10), SPLIT, busy(1, 0, web=2), CAP_2, 510, Rewrites(), id="other-tenant-at-cap"),
]


@pytest.mark.parametrize(("request_cost", "pool", "snapshot", "policy", "reserve_tokens", "rewrites"), ADMITS)
def test_admits(
    request_cost: RequestCost,
    pool: PoolSpec,
    snapshot: LedgerSnapshot,
    policy: Policy,
    reserve_tokens: int,
    rewrites: Rewrites,
) -> None:
    decision = plan(request_cost, pool, snapshot, policy)
    assert isinstance(decision, Admit), decision
    assert (decision.reserve_tokens, decision.rewrites) == (reserve_tokens, rewrites)
    assert len(decision.notes) >= bool(rewrites.num_ctx) + bool(rewrites.max_output_tokens)  # every rewrite says why


WAITS = [
    pytest.param(cost(10), OLLAMA, busy(4), DEFAULT, "pool", "all 4 sequence slots of model 'llama3.1:8b'", id="slots"),
    pytest.param(cost(10), UNIFIED, busy(4, 4), DEFAULT, "pool", "all 4 sequence slots", id="unified-slots"),
    pytest.param(
        cost(1500), UNIFIED, busy(3, 30769), DEFAULT, "pool", "30,769 of the 32,768 tokens", id="unified-one-over"
    ),
    pytest.param(cost(10, tenant="ci"), SPLIT, busy(1, 0, ci=2), CAP_2, "tenant", "tenant 'ci' has 2 of 2", id="cap"),
    pytest.param(cost(10, tenant="ci"), SPLIT, busy(2, 0, ci=2), CAP_2, "tenant", "tenant 'ci'", id="cap-first"),
    pytest.param(cost(3000, exact=False, tenant="ci"), SPLIT, LedgerSnapshot(1, 50, {"ci": 1}, {"ci": 50}),
                 Policy(per_tenant_max_share=1000), "tenant", "until the tenant holds nothing else",
                 id="estimate-over-its-share-waits-for-the-tenant"),
]


@pytest.mark.parametrize(("request_cost", "pool", "snapshot", "policy", "scope", "reason"), WAITS)
def test_waits(
    request_cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy, scope: str, reason: str
) -> None:
    decision = plan(request_cost, pool, snapshot, policy)
    assert isinstance(decision, Wait), decision
    assert decision.scope == scope
    assert reason in decision.reason


REJECTS = [
    pytest.param(cost(9214), OLLAMA, EMPTY, DEFAULT, "prompt is 9,214 tokens; model 'llama3.1:8b'", id="ollama-long"),
    pytest.param(cost(8192), OLLAMA, EMPTY, DEFAULT, "at most 8,191 prompt tokens", id="prompt-equals-context"),
    pytest.param(cost(3724, exact=False), SPLIT, EMPTY, DEFAULT, "about 3,724 tokens (estimated; 4,097", id="margin"),
    pytest.param(cost(3723, exact=False), SPLIT, EMPTY, DEFAULT, "(estimated; 4,096 with", id="margin-hits-context"),
    pytest.param(cost(5000, num_ctx=4096), OLLAMA, EMPTY, NO_PIN, "context of 4,096 tokens", id="unpinned-small-ctx"),
    pytest.param(cost(3000, out=2000), SPLIT, EMPTY, NO_CLAMP, "lower max output to at most 1,096", id="no-clamp"),
    pytest.param(cost(40000), UNIFIED, EMPTY, DEFAULT, "context of 32,768 tokens", id="unified"),
    pytest.param(cost(9000), OLLAMA, busy(4, 0, default=4), CAP_2, "prompt is 9,000", id="reject-beats-wait"),
]


@pytest.mark.parametrize(("request_cost", "pool", "snapshot", "policy", "message"), REJECTS)
def test_rejects(
    request_cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy, message: str
) -> None:
    decision = plan(request_cost, pool, snapshot, policy)
    assert isinstance(decision, Reject), decision
    assert (decision.status, decision.code) == (400, "context_length_exceeded")
    assert message in decision.message


def test_an_openai_pool_is_named_by_the_model_the_client_asked_for() -> None:
    """An OpenAI-compatible server's one pool is keyed "": messages name the client's model, never ''."""
    pool = PoolSpec.split_pool("vllm", "", BackendKind.OPENAI, slot_ctx_tokens=4096, slots=2)
    decision = plan(RequestCost(5000, True, None, None, model="qwen2.5-7b"), pool, EMPTY, DEFAULT)
    assert isinstance(decision, Reject) and "model 'qwen2.5-7b' on backend 'vllm'" in decision.message
    nameless = plan(RequestCost(5000, True, None, None), pool, EMPTY, DEFAULT)
    assert isinstance(nameless, Reject) and "''" not in nameless.message and "backend 'vllm'" in nameless.message


def test_estimate_notes_say_what_the_floor_is_and_why() -> None:
    decision = plan(cost(9000, exact=False, out=None), SPLIT, EMPTY, Policy(estimate_is_final=True))
    assert isinstance(decision, Admit)
    note = " ".join(decision.notes)
    assert "about 9,000 tokens (estimated; 9,900 with the safety margin)" in note
    assert "leaves 0 of the 4,096-token context" in note and "limited to 1,024 tokens" in note
    assert "the backend's own count decides" in note


def test_reject_message_names_limit_value_and_remedy() -> None:
    assert plan(cost(9214), OLLAMA, EMPTY, DEFAULT) == Reject(
        400,
        "context_length_exceeded",
        "prompt is 9,214 tokens; model 'llama3.1:8b' on backend 'gpu0' has a context of 8,192 tokens per sequence "
        "(at most 8,191 prompt tokens); shorten it or ask for a larger context",
    )


@pytest.mark.parametrize(
    ("request_cost", "policy", "note"),
    [
        (
            cost(10, num_ctx=16384),
            DEFAULT,
            "num_ctx 16,384 requested; model loaded with 8,192; pinned to avoid a reload",
        ),
        (cost(10, num_ctx=16384), NO_PIN, "num_ctx 16,384 requested; model loaded with 8,192; pin_num_ctx is off"),
        (cost(10), DEFAULT, "num_ctx not given; set to the loaded 8,192"),
        (cost(7000, out=2000, num_ctx=8192), DEFAULT, "max output 2,000 tokens requested; only 1,192 fit"),
        (cost(7800, out=None, num_ctx=8192), DEFAULT, "no output limit given; set to 392 tokens, the rest of its slot"),
    ],
)
def test_notes_explain_rewrites(request_cost: RequestCost, policy: Policy, note: str) -> None:
    decision = plan(request_cost, OLLAMA, EMPTY, policy)
    assert isinstance(decision, Admit)
    assert any(note in n for n in decision.notes), decision.notes


@pytest.mark.parametrize(
    ("prompt_tokens", "exact", "margin", "expected"),
    [
        (1000, True, 0.1, 1000),
        (1000, False, 0.1, 1100),
        (1001, False, 0.1, 1102),
        (0, False, 0.1, 0),
        (7, False, 1.0, 14),
    ],
)
def test_reserved_prompt_tokens(prompt_tokens: int, exact: bool, margin: float, expected: int) -> None:
    request_cost = RequestCost(prompt_tokens, exact, None, None)
    assert reserved_prompt_tokens(request_cost, Policy(estimate_margin=margin)) == expected


# --- properties --------------------------------------------------------------------------------------------------


@st.composite
def pools(draw: st.DrawFn) -> PoolSpec:
    kind = draw(st.sampled_from(list(BackendKind)))
    slot_ctx_tokens, slots, unified = draw(st.integers(1, 4096)), draw(st.integers(1, 8)), draw(st.booleans())
    pool_tokens = draw(st.integers(slot_ctx_tokens, slot_ctx_tokens * slots)) if unified else slot_ctx_tokens * slots
    return PoolSpec("b", "m", kind, slot_ctx_tokens, slots, unified, pool_tokens)


costs = st.builds(
    RequestCost,
    prompt_tokens=st.integers(0, 5000),
    prompt_exact=st.booleans(),
    max_output_tokens=st.none() | st.integers(0, 5000),
    requested_num_ctx=st.none() | st.integers(1, 8192),
    tenant=st.sampled_from(["a", "b"]),
    sequences=st.integers(1, 3),
)
snapshots = st.builds(
    LedgerSnapshot,
    active_sequences=st.integers(0, 8),
    reserved_tokens=st.integers(0, 40000),
    per_tenant_active=st.fixed_dictionaries({"a": st.integers(0, 4), "b": st.integers(0, 4)}),
)
policies = st.builds(
    Policy,
    default_output_tokens=st.integers(0, 3000),
    estimate_margin=st.sampled_from([0.0, 0.1, 0.25]),
    pin_num_ctx=st.booleans(),
    clamp_output=st.booleans(),
    per_tenant_max_active=st.none() | st.integers(1, 4),
    estimate_is_final=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(costs, pools(), snapshots, policies)
def test_any_admit_fits_its_sequence_and_pool(
    request_cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy
) -> None:
    decision = plan(request_cost, pool, snapshot, policy)
    assert decision == plan(request_cost, pool, snapshot, policy)  # pure: same inputs, same answer
    if not isinstance(decision, Admit):
        return
    unpinned_ctx = pool.backend_kind == "ollama" and not policy.pin_num_ctx and request_cost.requested_num_ctx
    context_tokens = request_cost.requested_num_ctx if unpinned_ctx else pool.slot_ctx_tokens
    assert context_tokens is not None
    prompt_tokens = reserved_prompt_tokens(request_cost, policy)
    assert prompt_tokens < context_tokens or (not request_cost.prompt_exact and policy.estimate_is_final)
    assert decision.reserve_tokens <= context_tokens * request_cost.sequences
    assert snapshot.active_sequences + request_cost.sequences <= pool.slots
    if pool.unified:
        assert snapshot.reserved_tokens + decision.reserve_tokens <= pool.pool_tokens
    # the backend is always bounded by the reservation: the client's limit, or the one kvgate sends in its place
    sent = decision.rewrites.max_output_tokens
    if request_cost.max_output_tokens is None:
        assert sent is not None
    elif sent is not None:
        assert sent < request_cost.max_output_tokens
    output_tokens = sent if sent is not None else request_cost.max_output_tokens
    assert output_tokens is not None
    per_sequence = decision.reserve_tokens // request_cost.sequences
    assert min(prompt_tokens + output_tokens, context_tokens) == per_sequence
    if request_cost.prompt_exact:  # a count is bounded by its reservation; an estimate by the context
        assert prompt_tokens + output_tokens == per_sequence


@settings(max_examples=300, deadline=None)
@given(costs, pools(), snapshots, policies)
def test_a_final_estimate_is_never_refused_for_its_length(
    request_cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy
) -> None:
    estimate = RequestCost(request_cost.prompt_tokens, False, request_cost.max_output_tokens,
                           request_cost.requested_num_ctx, request_cost.tenant, sequences=request_cost.sequences)
    decision = plan(estimate, pool, snapshot, dataclasses.replace(policy, estimate_is_final=True))
    assert not (isinstance(decision, Reject) and decision.code in ("context_length_exceeded",
                                                                   "tenant_share_exceeded")), decision



@settings(max_examples=300, deadline=None)
@given(costs, pools(), snapshots, policies)
def test_rejections_never_depend_on_the_snapshot(
    request_cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy
) -> None:
    rejected_now = isinstance(plan(request_cost, pool, snapshot, policy), Reject)
    assert rejected_now == isinstance(plan(request_cost, pool, EMPTY, policy), Reject)


def test_an_admitted_sequence_always_fits_an_empty_pool() -> None:
    decisions: list[Decision] = [plan(cost(p, out=None), UNIFIED, EMPTY, DEFAULT) for p in range(0, 32768, 997)]
    assert all(isinstance(d, Admit) for d in decisions)


@pytest.mark.parametrize("module", ["admission/types", "admission/planner", "admission/ledger", "admission/outcome",
                                    "admission/permit", "loads/gpu_ledger", "loads/plan"])
def test_pure_modules_import_no_event_loop_clock_or_logging(module: str) -> None:
    source = (Path(gateway.__file__).parent / f"{module}.py").read_text()
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert not imported & {"asyncio", "aiohttp", "time", "logging", "random", "os"}, imported


@pytest.mark.parametrize(
    ("request_cost", "pool", "snapshot", "expected"),
    [
        pytest.param(RequestCost(100, True, 100, None, sequences=2), SPLIT, EMPTY, Admit(400, Rewrites(), (), 2),
                     id="n2-holds-two-sequences"),
        pytest.param(RequestCost(100, True, 100, None, sequences=2), SPLIT, busy(1, 200), "wait", id="n2-one-slot"),
        pytest.param(RequestCost(100, True, 100, None, sequences=3), SPLIT, EMPTY, "too_many_sequences",
                     id="n-over-slots"),
        pytest.param(RequestCost(10000, True, 10000, None, sequences=4), UNIFIED, EMPTY, "too_many_sequences",
                     id="n-over-unified-pool"),
        pytest.param(RequestCost(100, True, None, None, sequences=2), UNIFIED, EMPTY,
                     Admit(16384, Rewrites(max_output_tokens=8092), ("no output limit given; set to 8,092 tokens, "
                                                                      "the sequence's fair share of the shared pool",),
                           2), id="n2-no-limit-fair-share"),
    ],
)
def test_sequences(request_cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, expected: object) -> None:
    decision = plan(request_cost, pool, snapshot, DEFAULT)
    if expected == "wait":
        assert isinstance(decision, Wait)
    elif isinstance(expected, str):
        assert isinstance(decision, Reject) and decision.code == expected and "(n)" in decision.message
    else:
        assert decision == expected
