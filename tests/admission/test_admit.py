"""The admission step of the request path (gateway/admission/admit.py) with a real waiting room, ledger and pool
directory, a fake set of backend probes, a fake clock and a fake ``recount`` that records what it was asked."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pytest

from gateway import dialects
from gateway.admission import AdmissionRejected, Ledger, LedgerSnapshot, PoolSpec, WaitingRoom
from gateway.admission.admit import AdmitAsk, Admitter, Asker
from gateway.admission.kv_pools import PoolDirectory
from gateway.admission.outcome import AdmissionDecision, Granted, Reserved, Trim, response_headers
from gateway.admission.planner import CONTEXT_LENGTH_EXCEEDED
from gateway.admission.shared.shared_rates import TenantRates
from gateway.admission.step import AdmissionStep
from gateway.admission.tenant_keys import Tenant
from gateway.backends import Backend
from gateway.backends.client import BackendClient
from gateway.backends.probes import BackendProbes
from gateway.backends.registry import BackendRegistry
from gateway.config.settings import load_settings
from gateway.domain import BackendKind, Dialect, Operation, ParsedRequest
from gateway.errors import BadRequest
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.runtimes import runtime_for
from gateway.tokens import TokenCount
from gateway.tokens.prompt_counter import PromptCounter
from tests.support.clock import FakeClock
from tests.support.poll import until

BACKEND = "gpu0"
SLOT_CTX_TOKENS = 4096
LLAMA_POOL = PoolSpec.split_pool(BACKEND, "m", BackendKind.LLAMA_SERVER, slot_ctx_tokens=SLOT_CTX_TOKENS, slots=2)
ONE_SLOT_POOL = PoolSpec.split_pool(BACKEND, "m", BackendKind.LLAMA_SERVER, slot_ctx_tokens=SLOT_CTX_TOKENS, slots=1)
OLLAMA_POOL = PoolSpec.split_pool(BACKEND, "llama3.1:8b", BackendKind.OLLAMA, slot_ctx_tokens=SLOT_CTX_TOKENS,
                                  slots=2)
UNIFIED_POOL = PoolSpec.unified_pool(BACKEND, "m", pool_tokens=8192, slots=4)
ANYONE = Tenant("anonymous")
OLLAMA_CONTEXT_TOKENS = 8192
"""What the fake /api/ps says an Ollama model is loaded with."""


def exact(tokens: int) -> TokenCount:
    return TokenCount(tokens, "tokenizer", True)


def estimate(tokens: int) -> TokenCount:
    return TokenCount(tokens, "estimate", False)


class FakeRecount:
    """Stands in for the proxy's recount: answers ``tokens_of(request)`` (exact unless told), records each request."""

    def __init__(self, tokens_of: Callable[[ParsedRequest], int] = lambda _: 0, *, exact: bool = True) -> None:
        self._tokens_of = tokens_of
        self._exact = exact
        self.calls: list[ParsedRequest] = []

    async def __call__(self, parsed: ParsedRequest) -> TokenCount:
        self.calls.append(parsed)
        return TokenCount(self._tokens_of(parsed), "tokenizer" if self._exact else "estimate", self._exact)


def recount_to(tokens: int, *, exact: bool = True) -> FakeRecount:
    return FakeRecount(lambda _: tokens, exact=exact)


class FakeProbes:
    """Stands in for BackendProbes: Ollama's loaded context, counting how often it was read."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

    async def loaded_model(self, backend: Backend, model: str, *, join_running: bool = True) -> LoadedModel | None:
        self.calls["ps"] += 1
        return LoadedModel(model, "", 0, 0, OLLAMA_CONTEXT_TOKENS, None, None)

    async def profile(self, backend: Backend, model: str) -> ModelProfile:
        raise LookupError("no profile in this test: one slot, assumed")

    def on_cpu(self, backend: str, model: str) -> float | None:
        return 0.0  # all on the GPU

    async def ollama_version(self, backend: Backend) -> str | None:
        return "0.30.0"


@dataclass
class Setup:
    admitter: Admitter
    room: WaitingRoom
    clock: FakeClock
    probes: FakeProbes
    backend: Backend
    step: AdmissionStep
    """The pools behind the admission step (pool_for, model_may_have_reloaded); nothing is counted or routed."""


def setup(backend: dict[str, Any] | None = None, **admission: Any) -> Setup:
    backend_config = backend or {"name": BACKEND, "kind": "llama-server", "url": "http://127.0.0.1:9"}
    settings = load_settings(None, backends=[backend_config], admission=admission)
    clock, probes = FakeClock(), FakeProbes()
    pools = PoolDirectory(settings, cast(BackendProbes, probes), clock=clock, sleep=clock.sleep)
    room = WaitingRoom(Ledger(), clock=clock, disconnect_poll_s=0.005)
    config = settings.backends[0]
    backend_object = Backend(config, cast(BackendClient, None), runtime=runtime_for(config.kind))
    admitter = Admitter(settings.admission, pools, room)
    step = AdmissionStep(admitter, pools, cast(BackendRegistry, None), cast(PromptCounter, None), TenantRates())
    return Setup(admitter, room, clock, probes, backend_object, step)


def openai_chat(**fields: Any) -> tuple[ParsedRequest, bytes]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], **fields}
    return parsed_of(Dialect.OPENAI, Operation.CHAT, "/v1/chat/completions", body)


def openai_completion(**fields: Any) -> tuple[ParsedRequest, bytes]:
    body = {"model": "m", "prompt": "hello", **fields}
    return parsed_of(Dialect.OPENAI, Operation.GENERATE, "/v1/completions", body)


def ollama_chat(**fields: Any) -> tuple[ParsedRequest, bytes]:
    body = {"model": "llama3.1:8b", "messages": [{"role": "user", "content": "hello"}], **fields}
    return parsed_of(Dialect.OLLAMA, Operation.CHAT, "/api/chat", body)


def parsed_of(dialect: Dialect, operation: Operation, path: str, body: dict[str, Any]) -> tuple[ParsedRequest, bytes]:
    raw = orjson.dumps(body)
    return dialects.parse(dialect, operation, dialects.decode_body(raw), path), raw


def never_gone() -> bool:
    return False


async def admit(
    s: Setup, request: tuple[ParsedRequest, bytes], pool: PoolSpec | None, count: TokenCount,
    tenant: Tenant = ANYONE, recount: FakeRecount | None = None, is_disconnected: Callable[[], bool] = never_gone,
) -> Granted:
    parsed, raw = request
    return await s.admitter.admit(AdmitAsk(parsed, raw, count, tenant), pool,
                                  Asker(is_disconnected, recount or FakeRecount()))


def forwarded(admitted: Granted) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(admitted.body)
    return body


# --- fits at once ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FitCase:
    name: str
    request: tuple[ParsedRequest, bytes]
    pool: PoolSpec
    count: TokenCount
    rewrites: tuple[str, ...]
    reserved_tokens: int
    fields: dict[str, Any]
    """Fields the forwarded body must have (nested as in the body)."""


FITS = [
    FitCase("a limit that fits: the client's bytes, untouched", openai_chat(max_tokens=100), LLAMA_POOL, exact(50),
            (), 150, {"max_tokens": 100}),
    FitCase("no limit: the planner writes the rest of the slot", openai_chat(), LLAMA_POOL, exact(50),
            ("max_tokens=4046 (was unset)",), SLOT_CTX_TOKENS, {"max_tokens": 4046}),
    FitCase("no limit in a unified pool: the fair share", openai_chat(), UNIFIED_POOL, exact(50),
            ("max_tokens=1998 (was unset)",), 2048, {"max_tokens": 1998}),
    FitCase("a limit past the context is clamped", openai_chat(max_tokens=5000), LLAMA_POOL, exact(96),
            ("max_tokens=4000 (was 5000)",), SLOT_CTX_TOKENS, {"max_tokens": 4000}),
    FitCase("an estimate reserves its margin", openai_chat(max_tokens=100), LLAMA_POOL, estimate(1000),
            (), 1100 + 100, {"max_tokens": 100}),
    FitCase("ollama: num_ctx pinned to the loaded context",
            ollama_chat(options={"num_ctx": 8192, "num_predict": 100}), OLLAMA_POOL, exact(50),
            ("options.num_ctx=4096 (was 8192)",), 150, {"options": {"num_ctx": 4096, "num_predict": 100}}),
]


@pytest.mark.parametrize("case", FITS, ids=lambda c: c.name)
async def test_a_request_that_fits_is_reserved_at_once(case: FitCase) -> None:
    s = setup()
    recount = FakeRecount()
    admitted = await admit(s, case.request, case.pool, case.count, recount=recount)
    outcome = admitted.outcome
    assert outcome.rewrites == case.rewrites
    assert outcome.reserved == Reserved(case.pool.key, case.reserved_tokens, 1)
    assert (outcome.waited_s, outcome.decision, outcome.count, outcome.recount) == (
        0.0, AdmissionDecision.ADMITTED, case.count, None)
    assert admitted.permit is not None and not admitted.permit.released
    assert s.room.ledger.snapshot(case.pool.key).reserved_tokens == case.reserved_tokens
    assert recount.calls == []
    if not case.rewrites:
        assert admitted.body is case.request[1]  # the client's own bytes, not a re-encoding
    body = forwarded(admitted)
    assert body == {**case.request[0].body, **case.fields}


async def test_the_planner_notes_travel_in_the_outcome() -> None:
    s = setup()
    admitted = await admit(s, openai_chat(), LLAMA_POOL, exact(50))
    assert any("no output limit given" in note for note in admitted.outcome.notes), admitted.outcome.notes


# --- the tenant's caps ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptCapCase:
    name: str
    count: TokenCount
    recount_tokens: int | None
    """What the recount answers (None: it must not be asked)."""
    refused_naming: int | None
    """The token count the refusal names; None when admitted."""
    reserved_prompt_tokens: int = 0
    """When admitted: the prompt's share of the reservation (an estimate's includes the 10 % margin)."""


PROMPT_CAP_TOKENS = 500
PROMPT_CAPS = [
    PromptCapCase("an exact count over the cap is refused, not recounted", exact(600), None, 600),
    PromptCapCase("an exact count within the cap is admitted", exact(500), None, None, 500),
    PromptCapCase("an estimate within the cap is not recounted", estimate(400), None, None, 440),
    PromptCapCase("an estimate over the cap recounted under it is admitted", estimate(600), 450, None, 450),
    PromptCapCase("an estimate over the cap recounted over it is refused", estimate(600), 700, 700),
]


@pytest.mark.parametrize("pool", [LLAMA_POOL, None], ids=["pool", "no pool"])
async def test_an_estimate_over_the_tenant_prompt_cap_is_not_refused(pool: PoolSpec | None) -> None:
    """The cap applies to a real count; an estimate over it whose recount is only another estimate is never refused:
    it goes on, and the outcome's note says so (for the log and the status page)."""
    s = setup()
    tenant = Tenant("ci", max_prompt_tokens=PROMPT_CAP_TOKENS)
    recount = recount_to(650, exact=False)
    admitted = await admit(s, openai_chat(max_tokens=100), pool, estimate(600), tenant, recount)
    assert admitted.outcome.recount == estimate(650) and len(recount.calls) == 1
    assert any("over tenant 'ci''s max_prompt_tokens of 500; not refused on an estimate" in note
               for note in admitted.outcome.notes), admitted.outcome.notes
    admitted.release()


@pytest.mark.parametrize("case", PROMPT_CAPS, ids=lambda c: c.name)
@pytest.mark.parametrize("pool", [LLAMA_POOL, None], ids=["pool", "no pool"])
async def test_the_tenant_prompt_cap_is_applied_to_a_real_count(case: PromptCapCase, pool: PoolSpec | None) -> None:
    s = setup()
    tenant = Tenant("ci", max_prompt_tokens=PROMPT_CAP_TOKENS)
    recount = recount_to(case.recount_tokens or 0)
    request = openai_chat(max_tokens=100)
    if case.refused_naming is not None:
        with pytest.raises(BadRequest) as refused:
            await admit(s, request, pool, case.count, tenant, recount)
        message = str(refused.value)
        assert f"prompt is {case.refused_naming:,} tokens" in message and "tenant 'ci' allows 500" in message
        assert s.room.ledger.keys() == ()
    else:
        admitted = await admit(s, request, pool, case.count, tenant, recount)
        expected = None if case.recount_tokens is None else exact(case.recount_tokens)
        assert admitted.outcome.recount == expected
        assert admitted.outcome.counted.tokens == (case.recount_tokens or case.count.tokens)
        if pool is not None:
            reserved = admitted.outcome.reserved
            assert reserved is not None and reserved.tokens == case.reserved_prompt_tokens + 100
    assert len(recount.calls) == (0 if case.recount_tokens is None else 1)
    assert all(call is request[0] for call in recount.calls)


@dataclass(frozen=True)
class OutputCapCase:
    name: str
    request: tuple[ParsedRequest, bytes]
    rewrites: tuple[str, ...]
    fields: dict[str, Any]
    reserved_output_tokens: int


OUTPUT_CAP_TOKENS = 64
OUTPUT_CAPS = [
    OutputCapCase("every limit field over the cap is lowered", openai_chat(max_tokens=100, max_completion_tokens=200),
                  ("max_completion_tokens=64 (was 200)", "max_tokens=64 (was 100)"),
                  {"max_tokens": 64, "max_completion_tokens": 64}, 64),
    OutputCapCase("no limit: the cap is written", openai_chat(), ("max_tokens=64 (was unset)",),
                  {"max_tokens": 64}, 64),
    OutputCapCase("a limit within the cap is kept", openai_chat(max_tokens=32), (), {"max_tokens": 32}, 32),
    OutputCapCase("ollama: num_predict lowered", ollama_chat(options={"num_ctx": 4096, "num_predict": 100}),
                  ("options.num_predict=64 (was 100)",), {"options": {"num_ctx": 4096, "num_predict": 64}}, 64),
]


@pytest.mark.parametrize("case", OUTPUT_CAPS, ids=lambda c: c.name)
async def test_the_tenant_output_cap_lowers_the_limit_in_every_field(case: OutputCapCase) -> None:
    s = setup()
    pool = OLLAMA_POOL if case.request[0].dialect is Dialect.OLLAMA else LLAMA_POOL
    tenant = Tenant("ci", max_output_tokens=OUTPUT_CAP_TOKENS)
    admitted = await admit(s, case.request, pool, exact(50), tenant)
    assert admitted.outcome.rewrites == case.rewrites
    assert forwarded(admitted) == {**case.request[0].body, **case.fields}
    assert admitted.outcome.reserved == Reserved(pool.key, 50 + case.reserved_output_tokens, 1)


# --- no pool: only the tenant's output cap ----------------------------------------------------------------------


@dataclass(frozen=True)
class NoPoolCase:
    name: str
    request: tuple[ParsedRequest, bytes]
    output_cap_tokens: int | None
    rewrites: tuple[str, ...]
    max_tokens: int | None


NO_POOL = [
    NoPoolCase("no cap: the client's bytes", openai_chat(max_tokens=100), None, (), 100),
    NoPoolCase("no cap and no limit: none is written", openai_chat(), None, (), None),
    NoPoolCase("a cap lowers the limit", openai_chat(max_tokens=100), 64, ("max_tokens=64 (was 100)",), 64),
    NoPoolCase("a cap is written when no limit is given", openai_chat(), 64, ("max_tokens=64 (was unset)",), 64),
    NoPoolCase("a limit within the cap is kept", openai_chat(max_tokens=32), 64, (), 32),
]


@pytest.mark.parametrize("case", NO_POOL, ids=lambda c: c.name)
async def test_without_a_pool_only_the_tenant_output_cap_applies(case: NoPoolCase) -> None:
    s = setup()
    tenant = Tenant("ci", max_output_tokens=case.output_cap_tokens)
    admitted = await admit(s, case.request, None, exact(50), tenant)
    outcome = admitted.outcome
    assert (admitted.permit, outcome.reserved, outcome.decision) == (
        None, None, AdmissionDecision.FORWARDED_WITHOUT_POOL)
    assert outcome.rewrites == case.rewrites
    if not case.rewrites:
        assert admitted.body is case.request[1]
    assert forwarded(admitted).get("max_tokens") == case.max_tokens
    admitted.release()  # nothing to release: harmless
    assert s.room.ledger.keys() == ()


# --- a prompt too long for the context ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TooLongCase:
    name: str
    count: TokenCount
    recount: TokenCount
    """What the recount answers."""
    admitted: bool
    recounts: int


TOO_LONG = [
    TooLongCase("an estimate recounted short enough is admitted", estimate(5000), exact(1000), True, 1),
    TooLongCase("an estimate recounted still too long is refused", estimate(5000), exact(5000), False, 1),
    TooLongCase("a recount that is only another estimate is forwarded, never refused", estimate(5000),
                estimate(1000), True, 1),
    TooLongCase("an exact count is refused without a recount", exact(5000), exact(1000), False, 0),
]


@pytest.mark.parametrize("case", TOO_LONG, ids=lambda c: c.name)
async def test_a_prompt_too_long_for_the_context_is_recounted_before_a_refusal(case: TooLongCase) -> None:
    s = setup(on_too_long="reject")  # the recount alone: no head-and-tail trim to recount as well
    request = openai_completion(max_tokens=100)
    recount = recount_to(case.recount.tokens, exact=case.recount.exact)
    if not case.admitted:
        with pytest.raises(AdmissionRejected) as refused:
            await admit(s, request, LLAMA_POOL, case.count, recount=recount)
        assert (refused.value.status, refused.value.code) == (400, CONTEXT_LENGTH_EXCEEDED)
        assert "model 'm' on backend 'gpu0' has a context of 4,096 tokens" in str(refused.value)
        assert s.room.ledger.keys() == ()
    elif case.recount.exact:
        admitted = await admit(s, request, LLAMA_POOL, case.count, recount=recount)
        assert admitted.outcome.recount == case.recount
        assert admitted.outcome.reserved == Reserved(LLAMA_POOL.key, case.recount.tokens + 100, 1)
        assert admitted.body is request[1]
    else:  # the estimate stands: forwarded as sent, reserving at most the context; the backend's count decides
        admitted = await admit(s, request, LLAMA_POOL, case.count, recount=recount)
        assert admitted.outcome.recount is None
        assert admitted.outcome.reserved == Reserved(LLAMA_POOL.key, SLOT_CTX_TOKENS, 1)
        assert admitted.body is request[1]  # the client's limit of 100 is under the floor: nothing rewritten
        assert any("the backend's own count decides" in note for note in admitted.outcome.notes)
    assert len(recount.calls) == case.recounts
    assert all(call is request[0] for call in recount.calls)


async def test_a_prompt_too_long_keeps_its_head_and_tail_around_a_marker() -> None:
    """/v1/completions, /api/generate: the prompt's first and last characters are kept, the middle replaced by a
    marker saying how much was left out, and the client is told (X-Kvgate-Trimmed)."""
    s = setup()
    prompt = "".join(f"{i:05d} " for i in range(2000))  # 12,000 characters
    parsed, raw = parsed_of(Dialect.OPENAI, Operation.GENERATE, "/v1/completions",
                            {"model": "m", "prompt": prompt, "max_tokens": 100})
    recount = FakeRecount(lambda request: len(request.body["prompt"]) // 2)  # 2 characters a token
    admitted = await admit(s, (parsed, raw), LLAMA_POOL, exact(6000), recount=recount)
    sent = forwarded(admitted)["prompt"]
    assert sent.startswith("00000 00001 ") and sent.endswith("01998 01999 ")
    assert "characters omitted by kvgate" in sent and len(sent) < len(prompt)
    trim = admitted.outcome.trim
    assert trim is not None and trim.after_tokens == len(sent) // 2 <= 4096 - 100
    header = response_headers(admitted.outcome)["X-Kvgate-Trimmed"]
    assert header.startswith("kept the first ") and "omitted; prompt 6,000 -> " in header
    admitted.release()


# --- a chat too long: trimmed, or refused ---------------------------------------------------------------------------

TOKENS_PER_MESSAGE = 600
HISTORY = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"},
    {"role": "user", "content": "u3"}, {"role": "assistant", "content": "a3"},
    {"role": "user", "content": "u4"},
]


def per_message(parsed: ParsedRequest) -> int:
    return TOKENS_PER_MESSAGE * len(parsed.messages)


async def test_a_chat_too_long_is_trimmed_oldest_turns_first_keeping_the_system_message() -> None:
    s = setup(on_too_long="trim")
    request = openai_chat(messages=HISTORY, max_tokens=100)
    recount = FakeRecount(per_message)
    before_tokens = TOKENS_PER_MESSAGE * len(HISTORY)  # 4,800: over the 4,096-token context
    admitted = await admit(s, request, LLAMA_POOL, exact(before_tokens), recount=recount)
    # room for 3,995 prompt tokens beside the 100 of output: six messages; the first turn (u1, a1) goes
    assert admitted.outcome.trim == Trim(2, len(HISTORY), before_tokens, 6 * TOKENS_PER_MESSAGE)
    body = forwarded(admitted)
    assert [m["content"] for m in body["messages"]] == ["be brief", "u2", "a2", "u3", "a3", "u4"]
    assert body["max_tokens"] == 100 and request[0].body["messages"] == HISTORY  # the client's body is untouched
    assert admitted.outcome.reserved == Reserved(LLAMA_POOL.key, 6 * TOKENS_PER_MESSAGE + 100, 1)
    assert admitted.outcome.forwarded_count.tokens == 6 * TOKENS_PER_MESSAGE
    assert recount.calls and all(call.messages[0]["role"] == "system" for call in recount.calls)


@pytest.mark.parametrize(("on_too_long", "tokens_per_message"), [
    ("reject", TOKENS_PER_MESSAGE),
    ("trim", 3000),  # even the system message with the newest turn is too long
], ids=["on_too_long=reject", "nothing to drop that would fit"])
async def test_a_chat_too_long_that_is_not_trimmed_is_refused(on_too_long: str, tokens_per_message: int) -> None:
    s = setup(on_too_long=on_too_long)
    recount = FakeRecount(lambda parsed: tokens_per_message * len(parsed.messages))
    with pytest.raises(AdmissionRejected) as refused:
        await admit(s, openai_chat(messages=HISTORY, max_tokens=100), LLAMA_POOL,
                    exact(tokens_per_message * len(HISTORY)), recount=recount)
    assert refused.value.code == CONTEXT_LENGTH_EXCEEDED
    assert s.room.ledger.keys() == ()
    if on_too_long == "reject":
        assert recount.calls == []


@pytest.mark.parametrize(("pool", "on_too_long", "trimmed"), [
    (OLLAMA_POOL, "trim", True),  # Ollama would cut it silently: kvgate's announced trim is the lesser change
    (OLLAMA_POOL, "reject", False),  # never refused on an estimate: forwarded, Ollama judges
    (LLAMA_POOL, "trim", False),  # llama-server refuses a prompt too long itself: forwarded unchanged
], ids=["ollama-trims", "ollama-never-refuses", "llama-server-forwards"])
async def test_a_chat_that_only_looks_too_long_is_trimmed_only_where_the_backend_would_cut_it_silently(
    pool: PoolSpec, on_too_long: str, trimmed: bool
) -> None:
    s = setup(on_too_long=on_too_long)
    recount = FakeRecount(per_message, exact=False)  # no counter can do better than an estimate
    request = openai_chat(messages=HISTORY, max_tokens=100)
    admitted = await admit(s, request, pool, estimate(TOKENS_PER_MESSAGE * len(HISTORY)), recount=recount)
    body = forwarded(admitted) if admitted.body is not request[1] else request[0].body
    if trimmed:
        assert admitted.outcome.trim is not None and len(body["messages"]) < len(HISTORY)
    else:
        assert admitted.outcome.trim is None and body["messages"] == HISTORY
        assert admitted.outcome.reserved == Reserved(pool.key, SLOT_CTX_TOKENS, 1)  # at most the context
        assert any("the backend's own count decides" in note for note in admitted.outcome.notes)
    admitted.release()


# --- waiting and releasing ------------------------------------------------------------------------------------------


async def test_a_second_request_waits_until_the_first_is_released() -> None:
    s = setup()
    first = await admit(s, openai_chat(max_tokens=100), ONE_SLOT_POOL, exact(50))
    second = asyncio.create_task(admit(s, openai_chat(max_tokens=100), ONE_SLOT_POOL, exact(50)))
    await until(lambda: s.room.queue_length(ONE_SLOT_POOL.key) == 1)
    assert not second.done()
    s.clock.advance(2.5)
    first.release()
    admitted = await asyncio.wait_for(second, timeout=5)
    outcome = admitted.outcome
    assert (outcome.waited_s, outcome.decision) == (2.5, AdmissionDecision.ADMITTED_AFTER_WAIT)
    assert "waited 2.50 s in the queue" in outcome.notes
    assert s.room.ledger.snapshot(ONE_SLOT_POOL.key) == LedgerSnapshot(1, 150, {"anonymous": 1}, {"anonymous": 150})
    admitted.release()


async def test_a_client_that_leaves_while_waiting_is_let_go() -> None:
    s = setup()
    first = await admit(s, openai_chat(max_tokens=100), ONE_SLOT_POOL, exact(50))
    gone = asyncio.Event()
    second = asyncio.create_task(admit(s, openai_chat(max_tokens=100), ONE_SLOT_POOL, exact(50),
                                       is_disconnected=gone.is_set))
    await until(lambda: s.room.queue_length(ONE_SLOT_POOL.key) == 1)
    gone.set()
    with pytest.raises(AdmissionRejected) as left:
        await asyncio.wait_for(second, timeout=5)
    assert left.value.status == 499
    assert s.room.queue_length(ONE_SLOT_POOL.key) == 0
    assert s.room.ledger.snapshot(ONE_SLOT_POOL.key).reserved_tokens == 150  # only the first one's
    first.release()


async def test_the_tenant_max_active_holds_its_second_request_not_others() -> None:
    s = setup()
    ci = Tenant("ci", max_active=1)
    first = await admit(s, openai_chat(max_tokens=100), LLAMA_POOL, exact(50), ci)
    second = asyncio.create_task(admit(s, openai_chat(max_tokens=100), LLAMA_POOL, exact(50), ci))
    await until(lambda: s.room.queue_length(LLAMA_POOL.key) == 1)
    other = await admit(s, openai_chat(max_tokens=100), LLAMA_POOL, exact(50), Tenant("web"))
    assert other.outcome.decision is AdmissionDecision.ADMITTED and not second.done()
    first.release()
    admitted = await asyncio.wait_for(second, timeout=5)
    assert admitted.outcome.reserved is not None
    for done in (admitted, other):
        done.release()
    assert s.room.ledger.keys() == ()


async def test_release_twice_is_harmless_and_returns_the_reservation_once() -> None:
    s = setup()
    admitted = await admit(s, openai_chat(max_tokens=100), ONE_SLOT_POOL, exact(50))
    assert s.room.ledger.snapshot(ONE_SLOT_POOL.key) == LedgerSnapshot(1, 150, {"anonymous": 1}, {"anonymous": 150})
    admitted.release()
    admitted.release()
    assert admitted.permit is not None and admitted.permit.released
    assert s.room.ledger.snapshot(ONE_SLOT_POOL.key) == LedgerSnapshot()
    s.room.ledger.check_invariants()
    again = await admit(s, openai_chat(max_tokens=100), ONE_SLOT_POOL, exact(50))  # the slot is free again
    assert again.outcome.decision is AdmissionDecision.ADMITTED
    again.release()


# --- the step's pool_for and model_may_have_reloaded ----------------------------------------------------------------

OLLAMA_BACKEND = {"name": BACKEND, "kind": "ollama", "url": "http://127.0.0.1:9"}


@pytest.mark.parametrize(("backend", "admission", "expected"), [
    (OLLAMA_BACKEND, {"enabled": False}, None),
    ({"name": BACKEND, "kind": "openai", "url": "http://127.0.0.1:9"}, {}, None),
    ({"name": BACKEND, "kind": "openai", "url": "http://127.0.0.1:9", "parallel": 2, "context_tokens": 8192,
      "unified_kv": False}, {},
     PoolSpec.split_pool(BACKEND, "", BackendKind.OPENAI, slot_ctx_tokens=8192, slots=2)),
    (OLLAMA_BACKEND, {},
     PoolSpec.split_pool(BACKEND, "llama3.1:8b", BackendKind.OLLAMA, slot_ctx_tokens=OLLAMA_CONTEXT_TOKENS, slots=1)),
], ids=["admission off", "openai without a layout", "openai with a layout", "ollama"])
async def test_pool_for(backend: dict[str, Any], admission: dict[str, Any], expected: PoolSpec | None) -> None:
    s = setup(backend, **admission)
    assert await s.step.pool_for(s.backend, "llama3.1:8b") == expected
    assert s.probes.calls["ps"] == (1 if expected is not None and expected.backend_kind is BackendKind.OLLAMA else 0)


@pytest.mark.parametrize(("model", "at_default", "probes_after"), [
    ("llama3.1:8b", False, 2),
    ("llama3.1:8b", True, 2),
    (None, False, 1),
    ("", True, 1),
    ("qwen2.5:7b", False, 1),  # another model's pool: this one stays cached
], ids=["reloaded", "loaded at the default", "no model", "empty model", "another model"])
async def test_a_model_that_may_have_reloaded_is_probed_again(
    model: str | None, at_default: bool, probes_after: int
) -> None:
    s = setup(OLLAMA_BACKEND)
    await s.step.pool_for(s.backend, "llama3.1:8b")
    await s.step.pool_for(s.backend, "llama3.1:8b")
    assert s.probes.calls["ps"] == 1  # cached
    s.step.model_may_have_reloaded(s.backend, model, at_default=at_default)
    await s.step.pool_for(s.backend, "llama3.1:8b")
    assert s.probes.calls["ps"] == probes_after
