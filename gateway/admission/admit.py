"""The admitter: one request on one KV pool, cost -> plan -> rewrite -> reserve (or wait, or refuse).

It holds the glue between the admission step (step.py) and the pure admission core: it builds the request's cost
from its count and limits, finds the model's KV pool, waits in the waiting room for a permit, and rewrites the body
as the planner said. What it did comes back as data (``outcome.AdmissionOutcome``), beside the body to forward and
the permit. The permit travels with the response and is released exactly once, when the response ends for any
reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gateway import dialects
from gateway.admission import AdmissionRejected, Permit, Policy, PoolSpec, RequestCost, Rewrites, WaitingRoom
from gateway.admission.elastic import ElasticPools
from gateway.admission.kv_pools import PoolDirectory
from gateway.admission.outcome import AdmissionOutcome, Granted, Reserved, SummaryNote, Trim
from gateway.admission.output_lengths import OutputLengths
from gateway.admission.planner import CONTEXT_LENGTH_EXCEEDED, reserved_prompt_tokens
from gateway.admission.tenant_keys import Tenant, tenant_policy
from gateway.admission.types import PoolKey
from gateway.config.settings import AdmissionSettings
from gateway.dialects.stream_end import endable
from gateway.domain import NO_OUTPUT_OPERATIONS, Operation, ParsedRequest
from gateway.errors import BadRequest
from gateway.fitting.chat_fit import trim_chat
from gateway.fitting.head_tail import keep_head_and_tail
from gateway.fitting.policy import FitPolicy
from gateway.fitting.rewrite import apply_rewrites, encode_body
from gateway.fitting.summaries import Summaries
from gateway.fitting.summary_fit import SummaryFailed
from gateway.loads.gate import LoadGate
from gateway.runtimes import runtime_for
from gateway.tokens import TokenCount

log = logging.getLogger(__name__)

Recount = Callable[[ParsedRequest], Awaitable[TokenCount]]


class NoClaim:
    """The claim of a request whose model kvgate does not manage: nothing to release."""

    def release(self) -> None:
        return None


NO_CLAIM = NoClaim()
DEFAULT_FIT = FitPolicy(remedies=("trim", "refuse"), keep_newest_turns=1, summary_model=None, summary_backend=None,
                        summary_instructions="", summary_max_tokens=16, summary_timeout_s=1.0)
"""Without a policy (tests, tools): ``admission.on_too_long`` (trim, then refuse; or refuse)."""


def policy_from(config: AdmissionSettings) -> Policy:
    return Policy(
        default_output_tokens=config.default_output_tokens,
        estimate_margin=config.estimate_margin,
        pin_num_ctx=config.pin_num_ctx,
        clamp_output=config.clamp_output,
        max_queue=config.max_queue,
        queue_timeout_s=config.queue_timeout_s,
        per_tenant_max_active=config.per_tenant_max_active,
        overtake_window_s=config.overtake_window_s,
        fair_queueing=config.queue_order == "fair",
        max_queue_share=config.max_queue_share,
        elastic_watermark=config.elastic.admit_watermark if config.elastic.enabled else None,
        elastic_floor_tokens=config.elastic.floor_tokens,
    )


@dataclass(frozen=True, slots=True)
class _Fitted:
    """The request a permit was granted for (the client's, or trimmed), its cost, and how it came to fit."""

    parsed: ParsedRequest
    cost: RequestCost
    permit: Permit
    recount: TokenCount | None = None
    trim: Trim | None = None
    summary: SummaryNote | None = None


def _tenant_capped(parsed: ParsedRequest, raw: bytes, cap: int | None, outcome: AdmissionOutcome) -> Granted:
    """Without a pool to plan against, only the tenant's output cap applies."""
    body, changes = apply_rewrites(parsed, Rewrites(max_output_tokens=cap))
    if body is None:
        return Granted(raw, outcome)
    return Granted(encode_body(body), replace(outcome, rewrites=tuple(changes)))


def _check_prompt_cap(tenant: Tenant, count: TokenCount) -> str | None:
    """The tenant's ``max_prompt_tokens``, per prompt (a batch's prompts each run as a sequence of their own): 400 for
    a counted prompt over it; an estimate over it is never refused (the real count was asked for and is not to be
    had): a note says so."""
    cap = tenant.max_prompt_tokens
    lengths = count.per_prompt or (count.tokens,)
    index = max(range(len(lengths)), key=lengths.__getitem__)
    if cap is None or lengths[index] <= cap:
        return None
    which = f"prompt[{index}] of the batch of {len(lengths)}" if count.per_prompt else "prompt"
    if not count.exact:
        return (f"{which} estimated at about {lengths[index]:,} tokens, over tenant '{tenant.name}''s "
                f"max_prompt_tokens of {cap:,}; not refused on an estimate (no exact count to be had)")
    raise BadRequest(f"{which} is {lengths[index]:,} tokens; tenant '{tenant.name}' allows {cap:,}; shorten it or "
                     "ask for a larger cap")


def _longest(count: TokenCount) -> int:
    return max(count.per_prompt or (count.tokens,))


def request_cost(parsed: ParsedRequest, pool: PoolSpec, count: TokenCount, tenant: Tenant,
                 limit: int | None) -> RequestCost:
    """What the request will hold in ``pool``: each prompt as counted, its output limit (none for an embedding or a
    rerank), and the completions of each prompt the backend runs (``sequence_rules``)."""
    return RequestCost(
        prompt_tokens=count.tokens,
        prompt_exact=count.exact,
        max_output_tokens=0 if parsed.operation in NO_OUTPUT_OPERATIONS else limit,
        requested_num_ctx=parsed.num_ctx_tokens if (parsed.num_ctx_tokens or 0) > 0 else None,
        tenant=tenant.name,
        priority=tenant.priority,
        sequences=runtime_for(pool.backend_kind).completions_run(parsed.sequences),
        weight=tenant.weight,
        batch_prompt_tokens=count.per_prompt if len(count.per_prompt) > 1 else (),
        model=parsed.model or "",
    )


def _output_cap(parsed: ParsedRequest, tenant: Tenant) -> tuple[int | None, bool]:
    """The output limit to plan with (the client's, lowered to the tenant's cap) and whether the cap lowered it;
    an embedding or a rerank generates nothing, so there is nothing to cap."""
    if parsed.operation in NO_OUTPUT_OPERATIONS:
        return None, False
    limit = parsed.output.tokens
    cap = tenant.max_output_tokens
    if cap is not None and (limit is None or limit > cap):
        return cap, True
    return limit, False


@dataclass(frozen=True, slots=True)
class Asker:
    """What admission may ask of the request's side while it decides: whether its client is still there (a queued
    request leaves when it is gone), and its prompt counted again, exactly (waiting for a tokenizer still loading)."""

    is_disconnected: Callable[[], bool]
    recount: Recount


@dataclass(slots=True)
class _Failures:
    """Why the remedies tried so far did not make a request fit: the words for its refusal, and the reasons
    (``SummaryFailed.reason``) of the summaries that failed."""

    failed: list[str] = field(default_factory=list)
    summary_reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AdmitAsk:
    """One request, as the admission step asks the admitter to admit it."""

    parsed: ParsedRequest
    raw: bytes
    count: TokenCount
    tenant: Tenant
    fit: FitPolicy | None = None
    """What a request too long for its context may have done to it; None: ``admission.on_too_long``."""
    deadline: tuple[float, str] | None = None


class Admitter:
    def __init__(
        self, config: AdmissionSettings, pools: PoolDirectory, room: WaitingRoom, loads: LoadGate | None = None,
        summaries: Summaries | None = None,
    ) -> None:
        self._pools = pools
        self.room = room
        self._loads = loads
        self._summaries = summaries
        self.lengths = OutputLengths()
        """The answers each pool's model gave lately (elastic reservations reserve a high quantile of them)."""
        self.elastic = ElasticPools(room.grow)
        self.reconfigure(config)

    def reconfigure(self, config: AdmissionSettings) -> None:
        """Admit new requests under ``config`` (a configuration reload, gateway/config/reload.py); a request already
        queued or admitted keeps the policy it was given, and its reservation."""
        self._config = config
        self._policy = policy_from(config)
        self._default_fit = replace(DEFAULT_FIT, remedies=("trim", "refuse") if config.on_too_long == "trim"
                                    else ("refuse",))
        self.lengths.resize(config.elastic.window, config.elastic.min_samples)
        self.elastic.step_tokens = config.elastic.step_tokens

    def _expected_output(self, parsed: ParsedRequest, pool: PoolSpec, tenant: Tenant) -> int | None:
        """What the request's answer will likely take, for an elastic reservation (planner rule 7): only for a
        reply kvgate can follow (a stream of one sequence in a dialect it counts and can end cleanly, or a reply
        that is not streamed on a server whose slots it reads) on a unified pool, and, with a shared ledger, only
        while Redis answers (each growth step is checked there); None: the whole limit is reserved."""
        elastic = self._config.elastic
        followed = endable(parsed.dialect, parsed.operation) if parsed.stream else (
            elastic.not_streamed and parsed.operation in (Operation.CHAT, Operation.GENERATE)
            and runtime_for(pool.backend_kind).slot_use_path is not None)  # read from its slots (slot_watch.py)
        shared = self.room.shared
        if (not elastic.enabled or not pool.unified or not followed or parsed.sequences != 1
                or (shared is not None and not shared.up)):  # Redis away: no growth step can be checked
            return None
        return self.lengths.expected(pool.key, tenant.name, elastic.quantile)

    def observed(self, key: PoolKey, tenant: str, output_tokens: int) -> None:
        """An answer on the pool ran ``output_tokens``: the distribution the next reservations read."""
        self.lengths.observe(key, tenant, output_tokens)

    @property
    def enabled(self) -> bool:
        """Whether admission is on (``admission.enabled``, as last configured)."""
        return bool(self._config.enabled)

    async def admit(
        self, ask: AdmitAsk, pool: PoolSpec | None, asker: Asker,
    ) -> Granted:
        """Reserve the request's sequences in ``pool`` (waiting if it must, while its client is there) and rewrite its
        body as planned; a request too long for the context meets the ask's fitting policy (default: trim, then
        refuse). The ask's deadline (seconds, and the header that set it) shortens how long it may wait in the queue.

        Nothing is refused on an estimate: a prompt that looks too long (for the tenant's cap or the context) is
        counted for real first (``asker.recount`` waits for a tokenizer still loading)."""
        parsed, raw, count, tenant, fit, deadline = ask.parsed, ask.raw, ask.count, ask.tenant, ask.fit, ask.deadline
        outcome = AdmissionOutcome(count)
        cap = tenant.max_prompt_tokens
        if cap is not None and _longest(count) > cap and not count.exact:
            count = await asker.recount(parsed)
            outcome = replace(outcome, recount=count)
        cap_note = _check_prompt_cap(tenant, count)
        if cap_note is not None:
            outcome = replace(outcome, notes=(cap_note,))
        limit, capped = _output_cap(parsed, tenant)
        if pool is None:
            return _tenant_capped(parsed, raw, limit if capped else None, outcome)
        cost = request_cost(parsed, pool, count, tenant, limit)
        expected = self._expected_output(parsed, pool, tenant)
        if expected is not None and (parsed.stream or count.exact):  # a slot is matched to a reply by its prompt
            cost = replace(cost, expected_output_tokens=expected)
        policy = tenant_policy(self._policy, tenant)
        if deadline is not None and deadline[0] < policy.queue_timeout_s:  # a deadline shortens the wait only
            policy = replace(policy, queue_timeout_s=deadline[0], queue_limit_name=f"the request's {deadline[1]}")
        fit = fit or self._default_fit
        fitted = await self._acquire_fitting(parsed, pool, cost, policy, asker, fit)
        permit = fitted.permit
        rewrites = permit.admit.rewrites
        if capped and rewrites.max_output_tokens is None:
            rewrites = replace(rewrites, max_output_tokens=fitted.cost.max_output_tokens)
        try:
            body, changes = apply_rewrites(fitted.parsed, rewrites)
            if body is None and fitted.parsed is not parsed:
                body = fitted.parsed.body  # trimmed or summarized, nothing else to change
            forwarded = raw if body is None else encode_body(body)
        except BaseException:
            permit.release()
            raise
        admit = permit.admit
        if self._loads is not None:
            self._loads.touch(pool.backend, pool.model)
        lowered = self._pools.lowered_for(pool)
        outcome = AdmissionOutcome(  # every field: built whole rather than replaced (~10 us on every request)
            outcome.count, recount=fitted.recount or outcome.recount, rewrites=tuple(changes), trim=fitted.trim,
            summary=fitted.summary,
            waited_s=permit.waited_s,
            reserved=Reserved(pool.key, admit.reserve_tokens, admit.sequences, admit.limit_tokens),
            notes=(*outcome.notes, *self._pools.notes_for(pool),
                   *runtime_for(pool.backend_kind).ignored_n_note(parsed.sequences), *admit.notes),
            context_lowered=None if lowered is None else (lowered.asked_tokens, lowered.loaded_tokens),
            offload=self._pools.offload_for(pool),
        )
        growth = self.elastic.start(permit, pool, reserved_prompt_tokens(fitted.cost, policy),
                                    streamed=fitted.parsed.stream)
        return Granted(forwarded, outcome, permit, growth)

    async def _acquire_fitting(
        self, parsed: ParsedRequest, pool: PoolSpec, cost: RequestCost, policy: Policy,
        asker: Asker, fit: FitPolicy,
    ) -> _Fitted:
        """A permit for the request as it is, or once really counted, or changed by the first of ``fit``'s remedies
        that makes it fit; the request and cost it was granted for. A counted prompt too long for the context is
        refused only after all of them.

        An estimate never refuses (no exact count to be had: the backend has no tokenizer kvgate can use): the
        request goes on unchanged, its output at the estimate floor (planner rule 3), and the backend's own count
        decides. It is trimmed or summarized on an estimate only where the backend would otherwise cut it silently
        (``_cuts_silently``: Ollama truncates a prompt past its context without a word), by the same remedies."""
        if cost.model != (parsed.model or ""):  # the model the messages name, for a pool keyed ""
            cost = replace(cost, model=parsed.model or "")
        is_disconnected, recount = asker.is_disconnected, asker.recount
        permit = await self._acquire(pool, cost, policy, is_disconnected)
        counted: TokenCount | None = None
        if isinstance(permit, AdmissionRejected) and not cost.prompt_exact:
            counted = await recount(parsed)
            if counted.exact:
                cost = replace(cost, prompt_tokens=counted.tokens, prompt_exact=True,
                               batch_prompt_tokens=counted.per_prompt if len(counted.per_prompt) > 1 else ())
                permit = await self._acquire(pool, cost, policy, is_disconnected)
            else:
                counted = None
        if not isinstance(permit, AdmissionRejected):
            return _Fitted(parsed, cost, permit, counted)
        if cost.prompt_exact or _cuts_silently(pool):
            remedied = await self._remedy(permit, parsed, pool, cost, recount, fit)
            if remedied is not None:
                changed, changed_cost, trim, summary = remedied
                granted = await self.room.acquire(pool.key, pool, changed_cost, policy,
                                                  is_disconnected=is_disconnected)
                return _Fitted(changed, changed_cost, granted, counted, trim, summary)
            if cost.prompt_exact:
                raise permit
        final = replace(policy, estimate_is_final=True)  # forwarded as sent: the backend's own count decides
        granted = await self.room.acquire(pool.key, pool, cost, final, is_disconnected=is_disconnected)
        return _Fitted(parsed, cost, granted, counted)

    def _target_tokens(self, pool: PoolSpec, cost: RequestCost) -> int:
        """The prompt length a changed request must reach: the context less room for the output (its limit, at most
        a quarter of the context), less the estimate's margin."""
        output = min(cost.max_output_tokens or self._config.default_output_tokens, pool.slot_ctx_tokens // 4)
        margin = 1.0 if cost.prompt_exact else 1.0 + self._config.estimate_margin
        return int((pool.slot_ctx_tokens - output - 1) / margin)

    async def _remedy(
        self, rejected: AdmissionRejected, parsed: ParsedRequest, pool: PoolSpec, cost: RequestCost,
        recount: Recount, fit: FitPolicy,
    ) -> tuple[ParsedRequest, RequestCost, Trim | None, SummaryNote | None] | None:
        """The request changed by the first remedy that makes it fit, with what was done; None when none does."""
        if rejected.code != CONTEXT_LENGTH_EXCEEDED:
            return None
        target = self._target_tokens(pool, cost)
        failures = _Failures()
        failed, summary_failures = failures.failed, failures.summary_reasons
        for remedy in fit.effective_remedies():
            if remedy == "summarize" and parsed.messages and self._summaries is not None:
                summarized = await self._summarize(parsed, cost, recount, fit, target, failures)
                if summarized is not None:
                    return summarized
            elif remedy == "trim":
                trimmed = await self._trim(parsed, cost, recount, target, failed)
                if trimmed is not None:
                    return _after_summary_failure(trimmed, summary_failures)
        if failed:
            rejected.message = f"{rejected.message} ({'; '.join(failed)})"
        rejected.summary_failure = summary_failures[0] if summary_failures else None
        return None

    async def _summarize(
        self, parsed: ParsedRequest, cost: RequestCost, recount: Recount, fit: FitPolicy, target: int,
        failures: _Failures,
    ) -> tuple[ParsedRequest, RequestCost, None, SummaryNote] | None:
        assert self._summaries is not None

        async def count(messages: list[dict[str, Any]]) -> int:
            return (await recount(_with_messages(parsed, messages))).tokens

        try:
            done = await self._summaries.fit(parsed.messages, parsed.dialect, fit, target_tokens=target, count=count)
        except SummaryFailed as exc:
            failures.failed.append(f"summary failed: {exc}")
            failures.summary_reasons.append(exc.reason)
            return None
        note = SummaryNote(done.replaced, len(parsed.messages), cost.prompt_tokens, done.prompt_tokens, done.cached)
        changed = _with_messages(parsed, done.messages)
        return changed, replace(cost, prompt_tokens=done.prompt_tokens), None, note

    async def _trim(
        self, parsed: ParsedRequest, cost: RequestCost, recount: Recount, target: int, failed: list[str],
    ) -> tuple[ParsedRequest, RequestCost, Trim, None] | None:
        """Drop the oldest history so the prompt fits, and cut the middle of a message that alone is too long
        (fitting/chat_fit.py; a prompt keeps its head and tail); None when it can't."""
        reason = "; ".join(failed) or None
        if parsed.messages or parsed.operation is Operation.RESPONSES:
            async def count(body: dict[str, Any]) -> int:
                return (await recount(_with_body(parsed, body))).tokens

            trimmed = await trim_chat(parsed.operation, parsed.body, count, target)
            if trimmed is None:
                return None
            trim = Trim(trimmed.dropped, trimmed.of_messages, cost.prompt_tokens, trimmed.prompt_tokens,
                        reason=reason, text=None if trimmed.cut is None else trimmed.describe(cost.prompt_tokens))
            changed = _with_body(parsed, trimmed.body)
            return changed, replace(cost, prompt_tokens=trimmed.prompt_tokens), trim, None
        prompt = parsed.body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return None

        async def count_text(text: str) -> int:
            return (await recount(_with_prompt(parsed, text))).tokens

        kept = await keep_head_and_tail(prompt, target_tokens=target, count=count_text)
        if kept is None:
            return None
        trim = Trim(0, 0, cost.prompt_tokens, kept.prompt_tokens, reason=reason,
                    text=kept.describe(cost.prompt_tokens))
        return _with_prompt(parsed, kept.prompt), replace(cost, prompt_tokens=kept.prompt_tokens), trim, None

    async def _acquire(
        self, pool: PoolSpec, cost: RequestCost, policy: Policy, is_disconnected: Callable[[], bool]
    ) -> Permit | AdmissionRejected:
        """A permit, or the refusal of a prompt too long for the context (which trimming may still cure)."""
        try:
            return await self.room.acquire(pool.key, pool, cost, policy, is_disconnected=is_disconnected)
        except AdmissionRejected as exc:
            if exc.code != CONTEXT_LENGTH_EXCEEDED:
                raise
            return exc


def _after_summary_failure(
    trimmed: tuple[ParsedRequest, RequestCost, Trim, None], summary_failures: list[str],
) -> tuple[ParsedRequest, RequestCost, Trim, None]:
    """A trim that followed a failed summary names the failure's reason (counted as summary_failed)."""
    if not summary_failures:
        return trimmed
    changed, cost, trim, _ = trimmed
    return changed, cost, replace(trim, summary_failure=summary_failures[0]), None


def _cuts_silently(pool: PoolSpec) -> bool:
    """Whether the backend cuts a prompt past its context without saying so (Ollama truncates to about half the
    context and answers 200; facts/ollama.md 4.6), so that an announced trim on an estimate is the lesser change.
    llama-server and OpenAI-compatible servers refuse such a prompt with their own 400 instead."""
    return runtime_for(pool.backend_kind).cuts_silently


def _with_messages(parsed: ParsedRequest, messages: list[dict[str, Any]]) -> ParsedRequest:
    return _with_body(parsed, {**parsed.body, "messages": messages})


def _with_body(parsed: ParsedRequest, body: dict[str, Any]) -> ParsedRequest:
    return dialects.parse(parsed.dialect, parsed.operation, body, "")


def _with_prompt(parsed: ParsedRequest, prompt: str) -> ParsedRequest:
    return dialects.parse(parsed.dialect, parsed.operation, {**parsed.body, "prompt": prompt}, "")
