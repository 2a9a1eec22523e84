"""The admission step of the request path: cost -> plan -> rewrite -> reserve (or wait, or refuse).

It holds the glue between the proxy and the pure admission core: it builds the request's cost from its count and
limits, finds the model's KV pool, waits in the waiting room for a permit, and rewrites the body as the planner
said. The permit travels with the response and is released exactly once, when the response ends for any reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.admission import AdmissionRejected, Permit, Policy, PoolSpec, RequestCost, Rewrites, WaitingRoom
from gateway.admission.planner import CONTEXT_LENGTH_EXCEEDED
from gateway.backends import Backend
from gateway.config import AdmissionConfig
from gateway.domain import Dialect, Operation, ParsedRequest
from gateway.errors import BadRequest
from gateway.fitting.rewrite import apply_rewrites, encode_body
from gateway.fitting.trim import trim_history
from gateway.pools import PoolDirectory
from gateway.tenants import Tenant
from gateway.tokens import TokenCount

Recount = Callable[[ParsedRequest], Awaitable[TokenCount | None]]


def policy_from(config: AdmissionConfig) -> Policy:
    return Policy(
        default_output_tokens=config.default_output_tokens,
        estimate_margin=config.estimate_margin,
        pin_num_ctx=config.pin_num_ctx,
        clamp_output=config.clamp_output,
        max_queue=config.max_queue,
        queue_timeout_s=config.queue_timeout_s,
        per_tenant_max_active=config.per_tenant_max_active,
        overtake_window_s=config.overtake_window_s,
    )


@dataclass
class Admission:
    """What to forward: the body (rewritten or the client's own) and headers telling the client what happened."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    permit: Permit | None = None

    def release(self) -> None:
        if self.permit is not None:
            self.permit.release()


def _tenant_capped(parsed: ParsedRequest, path: str, raw: bytes, cap: int | None) -> Admission:
    """Without a pool to plan against, only the tenant's output cap applies."""
    body, changes = apply_rewrites(parsed, path, Rewrites(max_output_tokens=cap))
    if body is None:
        return Admission(raw)
    return Admission(encode_body(body), {"X-Kvgate-Rewrite": "; ".join(changes)})


def _check_prompt_cap(tenant: Tenant, count: TokenCount) -> None:
    cap = tenant.max_prompt_tokens
    if cap is not None and count.tokens > cap:
        raise BadRequest(f"prompt is {count.tokens:,} tokens; tenant '{tenant.name}' allows {cap:,}; shorten it or "
                         "ask for a larger cap")


def _is_unload(parsed: ParsedRequest) -> bool:
    """Ollama's load/unload requests (no prompt, no messages) hold no sequence."""
    return parsed.dialect is Dialect.OLLAMA and not parsed.messages and not parsed.prompt


class Gate:
    def __init__(self, config: AdmissionConfig, pools: PoolDirectory, room: WaitingRoom) -> None:
        self._config = config
        self._policy = policy_from(config)
        self._pools = pools
        self.room = room

    async def admit(
        self,
        parsed: ParsedRequest,
        path: str,
        raw: bytes,
        backend: Backend,
        count: TokenCount | None,
        tenant: Tenant,
        is_disconnected: Callable[[], bool],
        recount: Recount,
    ) -> Admission:
        if parsed.operation not in (Operation.CHAT, Operation.GENERATE) or _is_unload(parsed):
            return Admission(raw)
        if count is not None:
            _check_prompt_cap(tenant, count)
        limit = parsed.max_output_tokens
        limit = limit if limit is not None and limit >= 0 else None
        capped = tenant.max_output_tokens is not None and (limit is None or limit > tenant.max_output_tokens)
        pool = None
        if self._config.enabled and count is not None and parsed.model is not None:
            pool = await self._pools.pool_for(backend, parsed.model)
        if pool is None or count is None:
            return _tenant_capped(parsed, path, raw, tenant.max_output_tokens if capped else None)
        cost = RequestCost(
            prompt_tokens=count.tokens,
            prompt_exact=count.exact,
            max_output_tokens=tenant.max_output_tokens if capped else limit,
            requested_num_ctx=parsed.num_ctx_tokens if (parsed.num_ctx_tokens or 0) > 0 else None,
            tenant=tenant.name,
            priority=tenant.priority,
        )
        policy = self._policy
        if tenant.max_active is not None:
            policy = replace(policy, per_tenant_max_active=tenant.max_active)
        headers: dict[str, str] = {}
        trimmed_body = False
        try:
            permit = await self.room.acquire(pool.key, pool, cost, policy, is_disconnected=is_disconnected)
        except AdmissionRejected as exc:
            trimmed = await self._trim(exc, parsed, pool, cost, recount)
            if trimmed is None:
                raise
            parsed, cost, note = trimmed
            trimmed_body = True
            headers.update({"X-Kvgate-Trimmed": note, "X-Kvgate-Prompt-Tokens": str(cost.prompt_tokens)})
            permit = await self.room.acquire(pool.key, pool, cost, policy, is_disconnected=is_disconnected)
        rewrites = permit.admit.rewrites
        if capped and rewrites.max_output_tokens is None:
            rewrites = replace(rewrites, max_output_tokens=cost.max_output_tokens)
        try:
            body, changes = apply_rewrites(parsed, path, rewrites)
            if body is None and trimmed_body:
                body = parsed.body
            forwarded = raw if body is None else encode_body(body)
        except BaseException:
            permit.release()
            raise
        headers["X-Kvgate-Reserved-Tokens"] = str(permit.admit.reserve_tokens)
        headers["X-Kvgate-Queue-Wait"] = f"{permit.waited_s:.3f}"
        if changes:
            headers["X-Kvgate-Rewrite"] = "; ".join(changes)
        return Admission(forwarded, headers, permit)

    async def _trim(
        self, rejected: AdmissionRejected, parsed: ParsedRequest, pool: PoolSpec, cost: RequestCost, recount: Recount
    ) -> tuple[ParsedRequest, RequestCost, str] | None:
        """Drop the oldest history so the prompt fits, leaving room for the output; None when it can't."""
        if rejected.code != CONTEXT_LENGTH_EXCEEDED or self._config.on_too_long != "trim" or not parsed.messages:
            return None
        output = min(cost.max_output_tokens or self._config.default_output_tokens, pool.slot_ctx_tokens // 4)
        margin = 1.0 if cost.prompt_exact else 1.0 + self._config.estimate_margin
        target = int((pool.slot_ctx_tokens - output - 1) / margin)

        async def count(messages: list[dict[str, Any]]) -> int:
            counted = await recount(replace(parsed, messages=tuple(messages),
                                            body={**parsed.body, "messages": messages}))
            return counted.tokens if counted is not None else 1 << 30

        trimmed = await trim_history(list(parsed.messages), count, target)
        if trimmed is None:
            return None
        body = {**parsed.body, "messages": trimmed.messages}
        note = trimmed.describe(len(parsed.messages), cost.prompt_tokens)
        return (replace(parsed, messages=tuple(trimmed.messages), body=body),
                replace(cost, prompt_tokens=trimmed.prompt_tokens), note)
