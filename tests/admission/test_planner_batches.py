"""The planner's rules for requests the backend runs as several sequences: multi-prompt batches (one task per
prompt), an embedding's inputs and a rerank's documents (no output), and ``n`` completions of each prompt."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission import Admit, LedgerSnapshot, Policy, PoolSpec, Reject, RequestCost, Rewrites, Wait, plan
from gateway.admission.planner import held_sequences
from gateway.domain import BackendKind

UNIFIED = PoolSpec.unified_pool("cpp", "tiny", pool_tokens=8192, slots=4)
SPLIT = PoolSpec.split_pool("cpp", "tiny", BackendKind.LLAMA_SERVER, slot_ctx_tokens=2048, slots=4)
EMPTY = LedgerSnapshot()
DEFAULT = Policy()


def batch(*prompts: int, out: int | None = 500, exact: bool = True, n: int = 1, tenant: str = "default") -> RequestCost:
    return RequestCost(sum(prompts), exact, out, None, tenant, sequences=n, batch_prompt_tokens=prompts)


ADMITS = [
    pytest.param(batch(900, 300, 2000), UNIFIED, EMPTY, DEFAULT, 4700, 3, Rewrites(), id="three-prompts-three-seqs"),
    pytest.param(batch(10, 20, 30, out=0), UNIFIED, EMPTY, DEFAULT, 60, 3, Rewrites(), id="embedding-inputs"),
    pytest.param(batch(500, 500, 500, 500, 500, 500, out=100), UNIFIED, EMPTY, DEFAULT, 2400, 4, Rewrites(),
                 id="past-the-slots-holds-what-runs-at-once"),
    pytest.param(batch(100, 900, 200, 700, 300, 800, out=100), UNIFIED, EMPTY, DEFAULT, 3100, 4, Rewrites(),
                 id="past-the-slots-the-longest-four"),
    pytest.param(batch(100, 200, out=50, n=2), UNIFIED, EMPTY, DEFAULT, 800, 4, Rewrites(), id="n2-per-prompt"),
    pytest.param(batch(100, 200, 300, out=50, n=2), UNIFIED, EMPTY, DEFAULT, 1200, 4, Rewrites(),
                 id="n2-batch-past-the-slots"),
    pytest.param(batch(1000, 3000, out=None), UNIFIED, EMPTY, DEFAULT, 6048, 2, Rewrites(max_output_tokens=1024),
                 id="no-limit-unified-fitted-to-longest"),
    pytest.param(batch(100, 1500, out=None), SPLIT, EMPTY, DEFAULT, 2696, 2, Rewrites(max_output_tokens=548),
                 id="no-limit-split-rest-of-longest-slot"),
    pytest.param(batch(100, 1800, out=500), SPLIT, EMPTY, DEFAULT, 2396, 2, Rewrites(max_output_tokens=248),
                 id="clamped-to-the-longest"),
    pytest.param(batch(1000, 1001, exact=False), UNIFIED, EMPTY, DEFAULT, 3202, 2, Rewrites(),
                 id="estimate-margin-per-prompt"),
    pytest.param(batch(100, 100, out=100), UNIFIED, LedgerSnapshot(2, 7792), DEFAULT, 400, 2, Rewrites(),
                 id="exactly-fills-the-pool"),
    pytest.param(batch(*[100] * 10, out=100), SPLIT, EMPTY, DEFAULT, 800, 4, Rewrites(), id="split-ten-prompts"),
    pytest.param(batch(1800, 1800, 1800, 1800, out=500), UNIFIED, EMPTY, DEFAULT, 8192, 4,
                 Rewrites(max_output_tokens=248), id="clamped-so-the-batch-fits-the-pool-together"),
    pytest.param(batch(1800, 1800, 1800, 1800, out=None), UNIFIED, EMPTY, DEFAULT, 8192, 4,
                 Rewrites(max_output_tokens=248), id="no-limit-set-so-the-batch-fits-together"),
    pytest.param(batch(*[1800] * 9, out=200), UNIFIED, EMPTY, DEFAULT, 8000, 4, Rewrites(),
                 id="past-the-slots-fits-as-asked"),
    pytest.param(RequestCost(3000, True, 2000, None, sequences=2), UNIFIED, EMPTY, DEFAULT, 8192, 2,
                 Rewrites(max_output_tokens=1096), id="n2-clamped-to-fit-together"),
]


@pytest.mark.parametrize(("request_cost", "pool", "snapshot", "policy", "tokens", "sequences", "rewrites"), ADMITS)
def test_batches_admit(request_cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy,
                       tokens: int, sequences: int, rewrites: Rewrites) -> None:
    decision = plan(request_cost, pool, snapshot, policy)
    assert isinstance(decision, Admit), decision
    assert (decision.reserve_tokens, decision.sequences, decision.rewrites) == (tokens, sequences, rewrites)


def test_a_batch_past_the_slots_says_what_it_holds() -> None:
    decision = plan(batch(*[500] * 6, out=100), UNIFIED, EMPTY, DEFAULT)
    assert isinstance(decision, Admit)
    assert "batch of 6 prompts: the backend runs 4 at once in its 4 slots and queues the rest itself; reserved " \
           "2,400 tokens for the 4 longest" in " ".join(decision.notes)


WAITS = [
    pytest.param(batch(10, 10, 10), UNIFIED, LedgerSnapshot(2, 100), DEFAULT, "pool", "all 4 sequence slots",
                 id="needs-three-slots"),
    pytest.param(batch(1000, 1000), UNIFIED, LedgerSnapshot(1, 6000), DEFAULT, "pool", "6,000 of the 8,192 tokens",
                 id="needs-its-sum-of-cells"),
    pytest.param(batch(10, 10, 10), UNIFIED, LedgerSnapshot(2, 100, {"default": 2}), Policy(per_tenant_max_active=4),
                 "tenant", "tenant 'default' has 2 of 4", id="tenant-counts-every-prompt"),
    pytest.param(batch(1000, 1000, out=500), UNIFIED, LedgerSnapshot(1, 1000, {}, {"default": 1000}),
                 Policy(per_tenant_max_share=3500), "tenant", "this request needs 3,000", id="tenant-share-the-sum"),
]


@pytest.mark.parametrize(("request_cost", "pool", "snapshot", "policy", "scope", "reason"), WAITS)
def test_batches_wait(request_cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy,
                      scope: str, reason: str) -> None:
    decision = plan(request_cost, pool, snapshot, policy)
    assert isinstance(decision, Wait), decision
    assert decision.scope == scope and reason in decision.reason, decision


REJECTS = [
    pytest.param(batch(100, 9000), UNIFIED, DEFAULT, "context_length_exceeded",
                 "prompt[1] of the batch of 2 is 9,000 tokens; model 'tiny' on backend 'cpp' has a context of 8,192 "
                 "tokens per sequence (at most 8,191 prompt tokens); shorten it (the batch is not trimmed)",
                 id="one-prompt-too-long-names-its-index"),
    pytest.param(batch(100, 2100, 50), SPLIT, DEFAULT, "context_length_exceeded", "prompt[1] of the batch of 3",
                 id="split-slot"),
    pytest.param(batch(1900, 1900, exact=False), SPLIT, DEFAULT, "context_length_exceeded",
                 "prompt[0] of the batch of 2 is about 1,900 tokens (estimated; 2,090 with the safety margin)",
                 id="estimate-too-long"),
    pytest.param(batch(100, 1800, out=500), SPLIT, Policy(clamp_output=False), "context_length_exceeded",
                 "prompt[1] of the batch of 2 is 1,800 tokens and max output is 500 tokens", id="no-clamp"),
    pytest.param(batch(1800, 1800, 1800, 1800, out=500), UNIFIED, Policy(clamp_output=False), "too_many_sequences",
                 "the batch of 4 prompts runs 4 sequences at once on model 'tiny' on backend 'cpp'; together they need "
                 "9,200 tokens and the shared pool of model 'tiny' on backend 'cpp' holds 8,192; send at most 3 "
                 "prompts per request", id="what-runs-at-once-overruns-the-pool-unclamped"),
    pytest.param(batch(*[2100] * 8, out=500), UNIFIED, DEFAULT, "too_many_sequences", "send at most 3 prompts",
                 id="the-prompts-that-run-at-once-overrun-alone"),
    pytest.param(batch(10, 10, 10), UNIFIED, Policy(per_tenant_max_active=2), "too_many_sequences",
                 "tenant 'default' may run at most 2 sequences at once; send at most 2 prompts per request",
                 id="tenant-max-active-per-prompt"),
    pytest.param(batch(10, 10, n=5), UNIFIED, DEFAULT, "too_many_sequences",
                 "runs at most 4 sequences at once; ask for fewer completions", id="n-over-slots"),
    pytest.param(batch(800, 800, out=500), UNIFIED, Policy(per_tenant_max_share=2000), "tenant_share_exceeded",
                 "the request needs 2,600 tokens: 2 prompts of up to 800 tokens + max output 500 each",
                 id="tenant-share-the-sum"),
]


@pytest.mark.parametrize(("request_cost", "pool", "policy", "code", "message"), REJECTS)
def test_batches_rejected(request_cost: RequestCost, pool: PoolSpec, policy: Policy, code: str, message: str) -> None:
    decision = plan(request_cost, pool, LedgerSnapshot(3, 7000), policy)
    assert isinstance(decision, Reject), decision
    assert (decision.status, decision.code) == (400, code)
    assert message in decision.message, decision.message
    assert plan(request_cost, pool, EMPTY, policy) == decision  # never because of what runs now


def test_a_clamp_to_fit_the_pool_together_says_why() -> None:
    decision = plan(batch(1800, 1800, 1800, 1800, out=500), UNIFIED, EMPTY, DEFAULT)
    assert isinstance(decision, Admit)
    assert decision.notes == ("max output 500 tokens requested; the 4 sequences that run at once (4 prompts, 1 "
                              "completion(s) each) fit the 8,192-token shared pool of model 'tiny' on backend 'cpp' "
                              "with 248 each; clamped to 248",)


def test_a_batch_of_one_is_one_prompt() -> None:
    one = plan(RequestCost(300, True, 100, None), UNIFIED, EMPTY, DEFAULT)
    assert isinstance(one, Admit) and (one.reserve_tokens, one.sequences) == (400, 1)


def test_batch_lengths_must_add_up() -> None:
    with pytest.raises(ValueError, match="add up to 30"):
        RequestCost(31, True, 0, None, batch_prompt_tokens=(10, 20))
    with pytest.raises(ValueError, match="negative"):
        RequestCost(0, True, 0, None, batch_prompt_tokens=(10, -10))


# --- properties --------------------------------------------------------------------------------------------------


@st.composite
def pools(draw: st.DrawFn) -> PoolSpec:
    slot_ctx_tokens, slots, unified = draw(st.integers(64, 4096)), draw(st.integers(1, 8)), draw(st.booleans())
    if unified:
        return PoolSpec.unified_pool("b", "m", pool_tokens=slot_ctx_tokens, slots=slots)
    return PoolSpec.split_pool("b", "m", BackendKind.LLAMA_SERVER, slot_ctx_tokens=slot_ctx_tokens, slots=slots)


@st.composite
def batches(draw: st.DrawFn) -> RequestCost:
    prompts = tuple(draw(st.lists(st.integers(0, 3000), min_size=2, max_size=10)))
    return RequestCost(sum(prompts), draw(st.booleans()), draw(st.none() | st.integers(0, 3000)), None,
                       draw(st.sampled_from(["a", "b"])), sequences=draw(st.integers(1, 3)),
                       batch_prompt_tokens=prompts)


snapshots = st.builds(LedgerSnapshot, active_sequences=st.integers(0, 8), reserved_tokens=st.integers(0, 20000),
                      per_tenant_active=st.fixed_dictionaries({"a": st.integers(0, 4)}))
policies = st.builds(Policy, estimate_margin=st.sampled_from([0.0, 0.1]), clamp_output=st.booleans(),
                     per_tenant_max_active=st.none() | st.integers(1, 6),
                     per_tenant_max_share=st.none() | st.integers(500, 20000))


@settings(max_examples=400, deadline=None)
@given(batches(), pools(), snapshots, policies)
def test_whatever_runs_at_once_fits_the_reservation(
    request_cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy
) -> None:
    """The backend starts any of the batch's tasks that have a slot, ``n`` slots each: whichever set runs at once
    holds no more than what was reserved, and the reservation fits the slots and (unified) the pool."""
    decision = plan(request_cost, pool, snapshot, policy)
    assert isinstance(plan(request_cost, pool, EMPTY, policy), Reject) == isinstance(decision, Reject)
    if not isinstance(decision, Admit):
        return
    n = request_cost.sequences
    assert decision.sequences == held_sequences(request_cost, pool) <= pool.slots
    assert snapshot.active_sequences + decision.sequences <= pool.slots
    if pool.unified:
        assert snapshot.reserved_tokens + decision.reserve_tokens <= pool.pool_tokens
    output = decision.rewrites.max_output_tokens
    output = request_cost.max_output_tokens if output is None else output
    assert output is not None
    context = pool.slot_ctx_tokens
    if request_cost.prompt_exact:  # a count: each sequence fits its own context
        assert all(prompt + output <= context for prompt in request_cost.prompts)
    # (an estimate leans high: its output is never below the estimate floor, and each sequence reserves at most the
    # context, which is all a sequence can hold; the backend's own count decides)
    running = decision.sequences // n
    for subset in itertools.islice(itertools.combinations(request_cost.prompts, running), 200):
        assert sum(min(p + output, context) for p in subset) * n <= decision.reserve_tokens
