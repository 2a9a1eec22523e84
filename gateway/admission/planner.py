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
2. Prompt. ``ceil(prompt * (1 + margin))`` when the count is an estimate, else the count. A prompt at least as long
   as the context is rejected (400 ``context_length_exceeded``): this is what prevents Ollama's silent truncation to
   about half the context and llama-server's own 400.
3. Output. The client's limit, else ``default_output_tokens``; if prompt + output exceed the context the output is
   clamped (a rewrite plus a note) or, without ``clamp_output``, the request is rejected. So a reservation never
   exceeds the context of one sequence, and a sequence that was admitted always fits an empty pool.
4. Capacity. The tenant's cap (Wait scope "tenant"), then free slots, then (unified pools only) free tokens
   (Wait scope "pool").

Rejections depend only on the request, the pool and the policy, never on the snapshot; so a request that would be
rejected is rejected at once instead of after a wait. No I/O, no clock, no logging: the same inputs give the same
Decision, and table-driven tests cover every rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.admission.model import (
    Admit,
    Decision,
    LedgerSnapshot,
    Policy,
    PoolSpec,
    Reject,
    RequestCost,
    Rewrites,
    Wait,
)

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def plan(cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy) -> Decision:
    """Decide whether the request's sequence fits the pool now, later or never."""
    context = _context(cost, pool, policy)
    prompt_tokens = reserved_prompt_tokens(cost, policy)
    if prompt_tokens >= context.tokens:
        return _prompt_too_long(cost, pool, prompt_tokens, context.tokens)
    output = _fit_output(cost, pool, policy, prompt_tokens, context.tokens)
    if isinstance(output, Reject):
        return output
    reserve_tokens = prompt_tokens + output.tokens
    wait = _capacity_wait(cost, pool, snapshot, policy, reserve_tokens)
    if wait is not None:
        return wait
    rewrites = Rewrites(num_ctx=context.rewrite, max_output_tokens=output.rewrite)
    return Admit(reserve_tokens, rewrites, context.notes + output.notes)


def reserved_prompt_tokens(cost: RequestCost, policy: Policy) -> int:
    """The prompt's share of a reservation: the count itself, or the estimate plus the margin, rounded up."""
    if cost.prompt_exact:
        return cost.prompt_tokens
    # round() first so that 1000 * 1.1 = 1100.0000000000002 does not become 1101
    return math.ceil(round(cost.prompt_tokens * (1.0 + policy.estimate_margin), 6))


@dataclass(frozen=True, slots=True)
class _Fit:
    """One step's outcome: the tokens it settles, the rewrite it needs (None: none) and notes for operators."""

    tokens: int
    rewrite: int | None = None
    notes: tuple[str, ...] = ()


def _context(cost: RequestCost, pool: PoolSpec, policy: Policy) -> _Fit:
    loaded = pool.slot_ctx_tokens
    asked = cost.requested_num_ctx
    if pool.backend_kind != "ollama" or asked == loaded:
        return _Fit(loaded)
    if asked is None:
        if not policy.pin_num_ctx:
            return _Fit(loaded)
        return _Fit(loaded, loaded, (f"num_ctx not given; set to the loaded {loaded:,} so no default reloads it",))
    asked_vs_loaded = f"num_ctx {asked:,} requested; model loaded with {loaded:,}"
    if policy.pin_num_ctx:
        return _Fit(loaded, loaded, (f"{asked_vs_loaded}; pinned to avoid a reload",))
    return _Fit(asked, None, (f"{asked_vs_loaded}; pin_num_ctx is off, so the model reloads",))


def _fit_output(
    cost: RequestCost, pool: PoolSpec, policy: Policy, prompt_tokens: int, context_tokens: int
) -> _Fit | Reject:
    room_tokens = context_tokens - prompt_tokens
    asked = cost.max_output_tokens
    if asked is None:
        if policy.default_output_tokens <= room_tokens:
            return _Fit(policy.default_output_tokens)
        note = f"no output limit given; reserved the {room_tokens:,} tokens left in the context"
        return _Fit(room_tokens, None, (note,))
    if asked <= room_tokens:
        return _Fit(asked)
    if policy.clamp_output:
        note = (
            f"max output {asked:,} tokens requested; only {room_tokens:,} fit after the {prompt_tokens:,}-token "
            f"prompt in the {context_tokens:,}-token context; clamped to {room_tokens:,}"
        )
        return _Fit(room_tokens, room_tokens, (note,))
    return Reject(
        400,
        CONTEXT_LENGTH_EXCEEDED,
        f"prompt is {_prompt_words(cost, prompt_tokens)} and max output is {asked:,} tokens, "
        f"{prompt_tokens + asked:,} in all; {_where(pool)} has a context of {context_tokens:,} tokens per sequence; "
        f"lower max output to at most {room_tokens:,} tokens or shorten the prompt",
    )


def _prompt_too_long(cost: RequestCost, pool: PoolSpec, prompt_tokens: int, context_tokens: int) -> Reject:
    return Reject(
        400,
        CONTEXT_LENGTH_EXCEEDED,
        f"prompt is {_prompt_words(cost, prompt_tokens)}; {_where(pool)} has a context of {context_tokens:,} tokens "
        f"per sequence (at most {context_tokens - 1:,} prompt tokens); shorten it or ask for a larger context",
    )


def _capacity_wait(
    cost: RequestCost, pool: PoolSpec, snapshot: LedgerSnapshot, policy: Policy, reserve_tokens: int
) -> Wait | None:
    cap = policy.per_tenant_max_active
    active = snapshot.per_tenant_active.get(cost.tenant, 0)
    if cap is not None and active >= cap:
        return Wait(f"tenant '{cost.tenant}' has {active} of {cap} allowed active requests on {_where(pool)}", "tenant")
    if snapshot.active_sequences >= pool.slots:
        return Wait(f"all {pool.slots} sequence slots of {_where(pool)} are busy")
    if pool.unified and snapshot.reserved_tokens + reserve_tokens > pool.pool_tokens:
        return Wait(
            f"{snapshot.reserved_tokens:,} of the {pool.pool_tokens:,} tokens in the shared pool of {_where(pool)} "
            f"are reserved; this request needs {reserve_tokens:,}"
        )
    return None


def _prompt_words(cost: RequestCost, prompt_tokens: int) -> str:
    if cost.prompt_exact:
        return f"{cost.prompt_tokens:,} tokens"
    return f"about {cost.prompt_tokens:,} tokens (estimated; {prompt_tokens:,} with the safety margin)"


def _where(pool: PoolSpec) -> str:
    return f"model '{pool.model}' on backend '{pool.backend}'"
