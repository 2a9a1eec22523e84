"""The admission planner: one pure function, ``plan(cost, pool, snapshot, policy) -> Decision``.

Theory of operation
-------------------
Inside a loaded model's KV pool every active sequence holds its prompt plus the output it may still generate. The
planner decides, for one request, whether that sequence fits *now* (Admit), fits *later* (Wait) or *never* (Reject):

    one sequence (at most slot_ctx_tokens):
    | prompt_tokens | margin (estimates only) | output: client limit, else default, clamped | . . . free . . . |
    |<------------------------------ reserve_tokens ---------------------------------->|
    |<--------------------------------------- slot_ctx_tokens -------------------------------------------->|

    split pool  (Ollama; llama-server -np N):   | slot 1: seq | slot 2: seq | slot 3: idle | slot 4: idle |
        each sequence needs only its own slot; admit while active_sequences < slots.
    unified pool (llama-server, -np omitted):   | seq A | seq B | seq C | . . . free cells . . . |
        every slot may grow to slot_ctx_tokens, so admit only while
        reserved_tokens + reserve_tokens <= pool_tokens  and  active_sequences < slots;
        otherwise llama-server fails every active request at once ("Context size has been exceeded.").

The rules, in the order they are applied:
1. Context. On Ollama with ``pin_num_ctx``, ``options.num_ctx`` is rewritten to the loaded slot context whenever the
   client sent another value or none (a different value reloads the model; ollama.md 4.5). Unpinned, the client's
   num_ctx is the context its sequence will run in (after Ollama reloads the model).
2. Prompt. ``ceil(prompt * (1 + margin))`` when the count is an estimate, else the count. A counted prompt at least
   as long as the context is rejected (400 ``context_length_exceeded``): this is what prevents Ollama's silent
   truncation to about half the context and llama-server's own 400. An estimate is never refused for its length:
   it is rejected here only while the real count may still come (the admitter then asks for it); once the
   estimate is final (``policy.estimate_is_final``) it is admitted, reserving at most the context, with the output
   at the estimate floor (rule 3), and the backend's own count decides.
3. Output. The client's limit; if prompt + output exceed the context the output is clamped (a rewrite plus a note)
   or, without ``clamp_output``, the request is rejected. So a reservation never exceeds the context of one
   sequence, and a sequence that was admitted always fits an empty pool. An estimate leans high, so it never
   clamps the output below the estimate floor, ``min(default_output_tokens, context // 4)``, and never refuses:

       estimate leaves room >= floor    as for a count, except that without clamp_output the client's limit is
                                        forwarded as sent instead of refused
       estimate leaves room <  floor    output at the floor (a smaller client limit stands; without clamp_output,
                                        the client's own), reserving min(prompt + output, context)
   A request with no limit (none given, or -1) still gets one, and the backend is told it (a rewrite of the
   dialect's limit field, ``max_tokens=N (was unset)``): a backend left without a limit generates until the context
   fills, past any reservation, and on a unified pool that fails every active request. The limit is chosen so that
   answers are not cut shorter than the pool allows:
       split pool    the rest of the sequence's own slot: nobody else can use it, so reserving it costs nothing
                     and the answer may run until the slot is full, exactly as without kvgate;
       unified pool  the request's fair share of the pool (pool_tokens / slots, less its prompt), at least
                     ``default_output_tokens``, at most the rest of the context: with every slot busy each answer
                     still has its share, and a request never reserves the whole pool for an answer that may be
                     short.
   Either way, with a tenant share (rule 5) the limit chosen is at most what the share leaves after the prompt:
   kvgate's own choice never makes a request too big for its tenant.
4. Sequences. A request for ``n`` completions runs ``n`` sequences, each holding prompt + output. More than the pool
   has slots (or, unified, more than the pool holds) can never run: rejected (400 ``too_many_sequences``).
   A batch (``batch_prompt_tokens``: ``"prompt": [a, b, c]``, an embedding's inputs, a rerank's documents) is one
   task per prompt on llama-server, each with its own slot and its own KV cells, and ``n`` completions of each:

       prompts a=900, b=300, c=2,000 tokens, max output 500, n=1, unified pool of 8,192 cells, 4 slots
       | a 900+500 | b 300+500 | c 2,000+500 | . . . free 3,092 . . . |      3 sequences, 5,100 tokens

   Each prompt is checked on its own (rule 2; the refusal names its index: a batch is never trimmed, since cutting
   one prompt of many silently changes one answer among the others, and llama-server itself refuses such a prompt);
   the output limit is one field for the whole batch, so it is fitted to the longest prompt (rule 3) and reserved
   for every prompt. A batch larger than the slots is not refused: llama-server starts as many of its tasks as it
   has free slots (a task with ``n`` completions waits for ``n`` free slots) and defers the others to its own queue,
   starting each when one of the batch's own tasks ends. kvgate reserves the batch so that it can never overrun:
   it holds ``min(prompts, slots // n)`` tasks' worth, the longest ones (whichever run at once, they hold no more),
   for the whole response, so nothing else is admitted into the slots the deferred tasks will take. Admitting only
   what can run at once is not possible: the server, not kvgate, starts the batch's tasks, all of them, in its
   slots. So on a unified pool the sequences that run at once (a batch's, or ``n`` completions of one prompt) must
   fit together: the output limit kvgate sets when none was given, or its clamp (``clamp_output``), is lowered to
   what each may hold for all of them to fit beside their prompts (a note says so); when even their prompts
   overrun the pool, or a limit is not to be clamped, the request is refused, saying how many prompts fit at once
   (alone it would fail every active request on the server).
5. Tenant share. ``per_tenant_max_share`` caps the tokens one tenant's reservations may hold in the pool at once,
   on top of ``per_tenant_max_active`` (which counts sequences). It is resolved against this pool here, so one
   policy serves pools of any size:

       share 0.25 (a float: a fraction)    -> floor(0.25 * pool_tokens) tokens of this pool
       share 6000 (an int: tokens)         -> 6,000 tokens of any pool

       pool 32,768 tokens, tenant 'ci' share 0.25 = 8,192:
       | ci 5,000 | web 9,000 | . . . free 18,768 . . . |
       ci asks 2,000  -> 5,000 + 2,000 <= 8,192: admit (if the pool has room)
       ci asks 4,000  -> 5,000 + 4,000 >  8,192: Wait scope "tenant" until ci's own sequences end
       ci asks 9,000  -> 9,000 > 8,192 on its own: Reject 400 ``tenant_share_exceeded`` (it could never run)

   It counts the same tokens as the pool's own budget: in a split pool each reservation is what its slot will
   hold, in a unified pool its part of the shared cells; either way ``pool_tokens`` is the whole.
6. Capacity. The tenant's caps, active sequences then its share (Wait scope "tenant"), then free slots, then
   (unified pools only) free tokens (Wait scope "pool").
7. Elastic reservations (``admission.elastic``, unified pools). A stream of one sequence whose model's answers are
   known (``cost.expected_output_tokens``, a high quantile of them: ``output_lengths``) reserves its prompt plus
   that expectation (at least ``elastic_floor_tokens``, at most the output limit of rule 3, which is still what the
   backend is told) instead of the whole limit, and grows as it streams (``elastic``). It is admitted only while
   the pool's reservations, its own included, stay within ``elastic_watermark`` of the pool (an empty pool always
   takes it): the rest is the growth room of the replies already running. ``Admit.limit_tokens`` is then what rule
   3 reserves, the most it may grow to.

                 unified pool of 2,048 cells, 4 slots, chats of 500-token prompts, limit 1,024, p95 of answers 200
       fixed:    | A 500+1,024 | . . . . free 524 . . . . |             one chat at a time
       elastic:  | A 700 | B 700 | . free 648 (watermark 1,843) . |     two at once; each grows by steps as it streams

Tenant caps count a batch per prompt: ``max_active`` counts every sequence it holds at once, ``max_pool_share`` its
reserved sum (the tenant's ``max_prompt_tokens`` and ``max_output_tokens`` apply to each prompt, in ``admit``).

Rejections depend only on the request, the pool and the policy, never on the snapshot; so a request that would be
rejected is rejected at once instead of after a wait. No I/O, no clock, no logging: the same inputs give the same
Decision, and table-driven tests cover every rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from gateway.admission.types import (
    Admit,
    Decision,
    LedgerSnapshot,
    Policy,
    PoolSpec,
    Reject,
    RequestCost,
    Wait,
)
from gateway.domain import BackendKind, Rewrites
from gateway.runtimes import runtime_for

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
TOO_MANY_SEQUENCES = "too_many_sequences"
TENANT_SHARE_EXCEEDED = "tenant_share_exceeded"


def plan(cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy) -> Decision:
    """Decide whether the request's sequences fit the pool now, later or never."""
    context = _context(cost, pool, policy)
    prompts = _reserved_prompts(cost, policy)
    longest = max(range(len(prompts)), key=prompts.__getitem__)
    prompt_tokens = prompts[longest]
    if prompt_tokens >= context.tokens and (cost.prompt_exact or not policy.estimate_is_final):
        return _prompt_too_long(cost, pool, prompt_tokens, context.tokens, longest)
    share_tokens = tenant_share_tokens(policy.per_tenant_max_share, pool)
    sequences = held_sequences(cost, pool)
    running = sorted(prompts, reverse=True)[: sequences // cost.sequences]
    together = _together_room(cost, pool, running, sequences)
    sizes = _Sizes(prompt_tokens, context.tokens, share_tokens, sequences, together)
    output = _fit_output(cost, pool, policy, sizes)
    if isinstance(output, Reject):
        return output
    # at most the context per sequence: an estimate's prompt + floor may exceed it, a count's never does (rule 3)
    reserve_tokens = sum(min(p + output.tokens, context.tokens) for p in running) * cost.sequences
    too_many = _too_many_sequences(cost, pool, policy, reserve_tokens, sequences, output.tokens)
    if too_many is not None:
        return too_many
    if share_tokens is not None and reserve_tokens > share_tokens:
        if cost.prompt_exact:
            return _over_share(cost, pool, policy, sizes, output.tokens, reserve_tokens)
        held = snapshot.per_tenant_tokens.get(cost.tenant, 0)
        if held:  # an estimate is never refused for the share: it runs once the tenant holds nothing else
            return Wait(f"tenant '{cost.tenant}' holds {held:,} tokens of {_where(pool, cost)}; this request's "
                        f"estimate ({reserve_tokens:,}) exceeds its share ({share_tokens:,}) on its own, so it waits "
                        "until the tenant holds nothing else", "tenant")
        sizes = _Sizes(prompt_tokens, context.tokens, None, sequences, together)  # it waits for no share
    elastic = _elastic_tokens(cost, pool, policy, sizes, output.tokens, reserve_tokens)
    wait = _capacity_wait(cost, pool, snapshot, policy, sizes, reserve_tokens if elastic is None else elastic,
                          elastic is not None)
    if wait is not None:
        return wait
    rewrites = Rewrites(num_ctx=context.rewrite, max_output_tokens=output.rewrite)
    notes = context.notes + output.notes + _batch_notes(cost, pool, sequences, reserve_tokens)
    if elastic is not None:
        notes = (*notes, f"elastic reservation: {elastic:,} tokens (the prompt and the {cost.expected_output_tokens:,}"
                 f" its model's answers usually take), growing to at most {reserve_tokens:,} as the reply streams")
        return Admit(elastic, rewrites, notes, sequences, limit_tokens=reserve_tokens)
    return Admit(reserve_tokens, rewrites, notes, sequences)


def _elastic_tokens(cost: RequestCost, pool: PoolSpec, policy: Policy, sizes: _Sizes, output_tokens: int,
                    reserve_tokens: int) -> int | None:
    """Rule 7, elastic reservations: on a unified pool, a stream of one sequence whose model's answers are known
    (``cost.expected_output_tokens``) first reserves its prompt plus that expectation (at least the floor, at most
    its limit) and grows as it streams (``elastic``); None where the whole limit is reserved."""
    expected = cost.expected_output_tokens
    if (expected is None or policy.elastic_watermark is None or not pool.unified or cost.sequences != 1
            or cost.batch_prompt_tokens):
        return None
    first_output = min(output_tokens, max(policy.elastic_floor_tokens, expected))
    tokens = min(sizes.prompt_tokens + first_output, sizes.context_tokens)
    return tokens if tokens < reserve_tokens else None


def reserved_prompt_tokens(cost: RequestCost, policy: Policy) -> int:
    """The prompt's share of a reservation: the count itself, or the estimate plus the margin, rounded up (for a
    batch: the sum of its prompts', each rounded up)."""
    return sum(_reserved_prompts(cost, policy))


def _reserved_prompts(cost: RequestCost, policy: Policy) -> list[int]:
    if cost.prompt_exact:
        return list(cost.prompts)
    # round() first so that 1000 * 1.1 = 1100.0000000000002 does not become 1101
    return [math.ceil(round(tokens * (1.0 + policy.estimate_margin), 6)) for tokens in cost.prompts]


def held_sequences(cost: RequestCost, pool: PoolSpec) -> int:
    """The sequences the request holds at once: ``n`` per prompt, for as many of its prompts as the backend runs at
    once (every prompt of a batch that fits the slots; ``slots // n`` prompts of a larger one, the rest deferred)."""
    running = min(len(cost.prompts), max(1, pool.slots // cost.sequences))
    return running * cost.sequences


def tenant_share_tokens(share: float | int | None, pool: PoolSpec) -> int | None:
    """A tenant's share of this pool in tokens: a float is a fraction of ``pool_tokens`` (rounded down), an int is
    tokens already; None is no cap."""
    if share is None:
        return None
    if isinstance(share, float):
        return math.floor(round(share * pool.pool_tokens, 6))  # round() first, as in reserved_prompt_tokens
    return share


@dataclass(frozen=True, slots=True)
class _Fit:
    """One step's outcome: the tokens it settles, the rewrite it needs (None: none) and notes for operators."""

    tokens: int
    rewrite: int | None = None
    notes: tuple[str, ...] = ()


_RELOADS_ON_NUM_CTX = frozenset(kind for kind in BackendKind if runtime_for(kind).reloads_on_num_ctx)
"""The kinds whose runtime reloads a model for another num_ctx, asked once (plan() runs per decision)."""


def _context(cost: RequestCost, pool: PoolSpec, policy: Policy) -> _Fit:
    loaded = pool.slot_ctx_tokens
    asked = cost.requested_num_ctx
    if pool.backend_kind not in _RELOADS_ON_NUM_CTX or asked == loaded:
        return _Fit(loaded)
    if asked is None:
        if not policy.pin_num_ctx:
            return _Fit(loaded)
        return _Fit(loaded, loaded, (f"num_ctx not given; set to the loaded {loaded:,} so no default reloads it",))
    asked_vs_loaded = f"num_ctx {asked:,} requested; model loaded with {loaded:,}"
    if policy.pin_num_ctx:
        return _Fit(loaded, loaded, (f"{asked_vs_loaded}; pinned to avoid a reload",))
    return _Fit(asked, None, (f"{asked_vs_loaded}; pin_num_ctx is off, so the model reloads",))


def _together_room(cost: RequestCost, pool: PoolSpec, running: list[int], sequences: int) -> int | None:
    """On a unified pool, the output each of a request's several sequences may reserve so that all that run at once
    fit the pool beside their prompts (None for one sequence, or a split pool, where each has its own slot)."""
    if not pool.unified or sequences < 2:
        return None
    return (pool.pool_tokens - sum(running) * cost.sequences) // sequences


class _Sizes(NamedTuple):
    """The sizes the output is fitted to, in tokens (a tuple: built once per decision, on the hot path)."""

    prompt_tokens: int
    """The (longest) prompt's."""
    context_tokens: int
    share_tokens: int | None
    """The tenant's share of the pool (None: no share set)."""
    sequences: int
    """How many sequences the request holds at once."""
    together: int | None
    """What each may have for all of them to fit a unified pool at once."""


def _fit_output(cost: RequestCost, pool: PoolSpec, policy: Policy, sizes: _Sizes) -> _Fit | Reject:
    """The output every sequence may generate: a limit kvgate chooses, or a clamp, stays within what all of them
    may have together (below 1 token, or without ``clamp_output``, rule 4 refuses)."""
    sequences, together = sizes.sequences, sizes.together
    fit = _fit_alone(cost, pool, policy, sizes)
    asked = cost.max_output_tokens
    if isinstance(fit, Reject) or together is None or not 1 <= together < fit.tokens:
        return fit
    if asked is not None and not policy.clamp_output:
        return fit  # rule 4 refuses it, saying how many prompts fit at once
    what = f"{len(cost.prompts)} prompts" if cost.batch_prompt_tokens else "its prompt"
    fits = f"the {sequences} sequences that run at once ({what}, {cost.sequences} completion(s) each) fit the " \
           f"{pool.pool_tokens:,}-token shared pool of {_where(pool, cost)} with {together:,} each"
    if asked is None:
        return _Fit(together, together, (f"no output limit given; set to {together:,} tokens: {fits}",))
    return _Fit(together, together, (f"max output {asked:,} tokens requested; {fits}; clamped to {together:,}",))


def _fit_alone(cost: RequestCost, pool: PoolSpec, policy: Policy, sizes: _Sizes) -> _Fit | Reject:
    """The output one sequence may generate in its context (rule 3)."""
    prompt_tokens, context_tokens, share_tokens, sequences = (sizes.prompt_tokens, sizes.context_tokens,
                                                              sizes.share_tokens, sizes.sequences)
    room_tokens = context_tokens - prompt_tokens
    asked = cost.max_output_tokens
    if not cost.prompt_exact:
        floor = estimate_output_floor(policy, context_tokens)
        if room_tokens < floor:
            return _estimate_floor(cost, pool, policy, prompt_tokens, context_tokens, floor)
    if asked is None:
        granted = room_tokens
        if pool.unified:
            share = pool.pool_tokens // pool.slots - prompt_tokens
            granted = min(room_tokens, max(policy.default_output_tokens, share))
        where = "the sequence's fair share of the shared pool" if pool.unified else "the rest of its slot"
        tenant_room = None if share_tokens is None else share_tokens // sequences - prompt_tokens
        if tenant_room is not None and 1 <= tenant_room < granted:  # below 1 nothing fits: rule 5 refuses it
            granted = tenant_room
            where = f"what tenant '{cost.tenant}'s share of the pool leaves after the prompt"
        note = f"no output limit given; set to {granted:,} tokens, {where}"
        return _Fit(granted, granted, (note,))
    if asked <= room_tokens:
        return _Fit(asked)
    if policy.clamp_output:
        note = (
            f"max output {asked:,} tokens requested; only {room_tokens:,} fit after the {prompt_tokens:,}-token "
            f"prompt in the {context_tokens:,}-token context; clamped to {room_tokens:,}"
        )
        return _Fit(room_tokens, room_tokens, (note,))
    if not cost.prompt_exact:  # never refused on an estimate: the client's limit stands, the backend judges
        return _Fit(asked, None, (f"max output {asked:,} tokens requested with an estimated prompt; left as sent "
                                  "(clamp_output is off), for the backend to judge",))
    return Reject(
        400,
        CONTEXT_LENGTH_EXCEEDED,
        f"{_prompt_words(cost, prompt_tokens)} and max output is {asked:,} tokens, "
        f"{prompt_tokens + asked:,} in all; {_where(pool, cost)} has a context of {context_tokens:,} tokens per "
        f"sequence; lower max output to at most {room_tokens:,} tokens or shorten the prompt",
    )


def estimate_output_floor(policy: Policy, context_tokens: int) -> int:
    """The least output an estimated prompt is left: a quarter of the context, at most ``default_output_tokens``
    (an estimate leans high: the room it leaves is often too small, and the backend counts exactly)."""
    return max(1, min(policy.default_output_tokens, context_tokens // 4))


def _estimate_floor(
    cost: RequestCost, pool: PoolSpec, policy: Policy, prompt_tokens: int, context_tokens: int, floor: int
) -> _Fit:
    """An estimated prompt that leaves less than the floor for output (or looks too long): output at the floor (the
    client's smaller limit, or without ``clamp_output`` the client's own), forwarded for the backend to judge."""
    asked = cost.max_output_tokens
    left = max(0, context_tokens - prompt_tokens)
    said = (f"{_prompt_words(cost, prompt_tokens)}, which leaves {left:,} of the {context_tokens:,}-token "
            f"context of {_where(pool, cost)}; an estimate leans high, so it is not refused or trimmed on it")
    if asked is not None and (asked <= floor or not policy.clamp_output):
        return _Fit(asked, None, (f"{said}: the client's max output of {asked:,} stands and the backend's own count "
                                  "decides",))
    note = (f"{said}: output limited to {floor:,} tokens (the estimate floor: a quarter of the context, at most "
            "default_output_tokens) and the backend's own count decides")
    return _Fit(floor, floor, (note,))


def _prompt_too_long(
    cost: RequestCost, pool: PoolSpec, prompt_tokens: int, context_tokens: int, index: int
) -> Reject:
    shorten = "shorten it (the batch is not trimmed)" if cost.batch_prompt_tokens else "shorten it"
    return Reject(
        400,
        CONTEXT_LENGTH_EXCEEDED,
        f"{_prompt_words(cost, prompt_tokens, index)}; {_where(pool, cost)} has a context of {context_tokens:,} tokens "
        f"per sequence (at most {context_tokens - 1:,} prompt tokens); {shorten} or ask for a larger context",
    )


def _too_many_sequences(
    cost: RequestCost, pool: PoolSpec, policy: Policy, reserve_tokens: int, sequences: int, output_tokens: int
) -> Reject | None:
    """A request whose sequences could never run at once, even in an empty pool."""
    n = cost.sequences
    cap = policy.per_tenant_max_active
    if n > pool.slots:
        limit = f"{_where(pool, cost)} runs at most {pool.slots} sequences at once"
    elif cap is not None and sequences > cap:
        limit = f"tenant '{cost.tenant}' may run at most {cap} sequences at once"
    elif pool.unified and reserve_tokens > pool.pool_tokens:
        limit = f"together they need {reserve_tokens:,} tokens and the shared pool of {_where(pool, cost)} holds " \
                f"{pool.pool_tokens:,}"
    else:
        return None
    if not cost.batch_prompt_tokens:
        return Reject(400, TOO_MANY_SEQUENCES, f"the request asks for {n} completions (n); {limit}; ask for fewer")
    asks = f"the batch of {len(cost.prompts)} prompts" + (f" x {n} completions (n)" if n > 1 else "")
    fit = _prompts_that_fit(cost, pool, policy, output_tokens, cap)
    advice = "ask for fewer completions" if fit == 0 else \
        f"send at most {fit} prompt{'s' if fit > 1 else ''} per request"
    return Reject(400, TOO_MANY_SEQUENCES,
                  f"{asks} runs {sequences} sequences at once on {_where(pool, cost)}; {limit}; {advice}")


def _prompts_that_fit(cost: RequestCost, pool: PoolSpec, policy: Policy, output_tokens: int, cap: int | None) -> int:
    """How many of the batch's longest prompts could run at once (the advice of a refusal)."""
    n = cost.sequences
    most = min(pool.slots, cap if cap is not None else pool.slots) // n
    held = 0
    for count, tokens in enumerate(sorted(_reserved_prompts(cost, policy), reverse=True)[:most], start=1):
        held += (tokens + output_tokens) * n
        if pool.unified and held > pool.pool_tokens:
            return count - 1
    return min(most, len(cost.prompts))


def _batch_notes(cost: RequestCost, pool: PoolSpec, sequences: int, reserve_tokens: int) -> tuple[str, ...]:
    """What a batch larger than the slots holds, for operators."""
    prompts = len(cost.batch_prompt_tokens)
    running = sequences // cost.sequences
    if prompts <= running:
        return ()
    return (f"batch of {prompts} prompts: the backend runs {running} at once in its {pool.slots} slots and queues "
            f"the rest itself; reserved {reserve_tokens:,} tokens for the {running} longest, held until all end",)


def _over_share(
    cost: RequestCost, pool: PoolSpec, policy: Policy, sizes: _Sizes, output_tokens: int, reserve_tokens: int,
) -> Reject:
    """A request that alone needs more than its tenant's share of the pool: it could never run, even alone."""
    prompt_tokens, share_tokens = sizes.prompt_tokens, sizes.share_tokens
    assert share_tokens is not None, "only a tenant with a share is over it"
    if cost.batch_prompt_tokens:
        parts = f"{len(cost.prompts)} prompts of up to {prompt_tokens:,} tokens + max output {output_tokens:,} each"
    else:
        parts = f"prompt {_tokens_words(cost, prompt_tokens, 0)} + max output {output_tokens:,}"
    if cost.sequences > 1:
        parts = f"({parts}) x {cost.sequences} completions"
    return Reject(
        400,
        TENANT_SHARE_EXCEEDED,
        f"the request needs {reserve_tokens:,} tokens: {parts}; tenant '{cost.tenant}' may hold at most "
        f"{_share_words(policy, share_tokens, pool, cost)}; lower max output, shorten the prompt or ask for a larger "
        "share",
    )


def _share_words(policy: Policy, share_tokens: int, pool: PoolSpec, cost: RequestCost | None = None) -> str:
    """'4,096 tokens (max_pool_share 0.125 of 32,768) in model ...', or '(max_pool_share)' for a number of tokens."""
    share = policy.per_tenant_max_share
    setting = f"max_pool_share {share:g} of {pool.pool_tokens:,}" if isinstance(share, float) else "max_pool_share"
    return f"{share_tokens:,} tokens ({setting}) in {_where(pool, cost)}"


def _capacity_wait(
    cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy, sizes: _Sizes, reserve_tokens: int,
    elastic: bool = False,
) -> Wait | None:
    share_tokens, sequences = sizes.share_tokens, sizes.sequences
    cap = policy.per_tenant_max_active
    active = snapshot.per_tenant_active.get(cost.tenant, 0)
    if cap is not None and active + sequences > cap:
        return Wait(f"tenant '{cost.tenant}' has {active} of {cap} allowed active requests on {_where(pool, cost)}",
                    "tenant")
    held = snapshot.per_tenant_tokens.get(cost.tenant, 0)
    if share_tokens is not None and held + reserve_tokens > share_tokens:
        return Wait(
            f"tenant '{cost.tenant}' holds {held:,} of its {_share_words(policy, share_tokens, pool, cost)}; "
            f"this request needs {reserve_tokens:,}",
            "tenant",
        )
    if snapshot.active_sequences + sequences > pool.slots:
        return Wait(f"all {pool.slots} sequence slots of {_where(pool, cost)} are busy")
    if pool.unified and snapshot.reserved_tokens + reserve_tokens > pool.pool_tokens:
        return Wait(
            f"{snapshot.reserved_tokens:,} of the {pool.pool_tokens:,} tokens in the shared pool of "
            f"{_where(pool, cost)} are reserved; this request needs {reserve_tokens:,}"
        )
    if elastic and snapshot.reserved_tokens and policy.elastic_watermark is not None:
        watermark_tokens = math.floor(round(policy.elastic_watermark * pool.pool_tokens, 6))
        if snapshot.reserved_tokens + reserve_tokens > watermark_tokens:  # the rest is the running replies' growth
            return Wait(
                f"{snapshot.reserved_tokens:,} of the {pool.pool_tokens:,} tokens in the shared pool of "
                f"{_where(pool, cost)} are reserved; this request needs {reserve_tokens:,} and is admitted up to "
                f"{watermark_tokens:,} (admission.elastic.admit_watermark {policy.elastic_watermark:g}), the rest "
                "kept for the replies that are growing"
            )
    return None


def _prompt_words(cost: RequestCost, prompt_tokens: int, index: int | None = None) -> str:
    """'prompt is 1,234 tokens' (a batch: 'prompt[2] of the batch of 5 is ...'), an estimate with its margin."""
    if index is None:
        index = max(range(len(cost.prompts)), key=cost.prompts.__getitem__)
    which = f"prompt[{index}] of the batch of {len(cost.prompts)}" if cost.batch_prompt_tokens else "prompt"
    return f"{which} is {_tokens_words(cost, prompt_tokens, index)}"


def _tokens_words(cost: RequestCost, prompt_tokens: int, index: int) -> str:
    counted = cost.prompts[index]
    if cost.prompt_exact:
        return f"{counted:,} tokens"
    return f"about {counted:,} tokens (estimated; {prompt_tokens:,} with the safety margin)"


def _where(pool: PoolSpec, cost: RequestCost | None = None) -> str:
    """The pool in words: its model, or (a server's one pool, keyed "") the model the client asked for."""
    model = pool.model or (cost.model if cost is not None else "")
    return f"model '{model}' on backend '{pool.backend}'" if model else f"backend '{pool.backend}'"
