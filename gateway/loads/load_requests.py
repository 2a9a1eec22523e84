"""Ollama's load and unload requests through the load gate (issue 23, point 4).

A chat without messages or a generate without a prompt reserves no KV: before issue 23 it went straight to the
backend, so a plain client could load a model beside a foreign process (out of memory), evict what others run on,
or make Ollama reload a model at another context. Now:

    load request      the model is loaded through the GPU check (``Admitter.pool_for``: the load gate's decision,
                      unloads and lowered context, or 503 ``gpu_memory_exhausted`` with Retry-After), then the
                      request is forwarded with ``options.num_ctx`` pinned to the loaded context (the backend
                      answers at once, nothing reloads), the model held resident while it runs
    unload request    (``keep_alive`` 0, which only the admin's request still carries: loads/keep_alive.py)
                      forwarded under the backend's load lock, so it never lands in the middle of kvgate's own
                      decision and load

Without admission, or on a backend with no pool to read, it is forwarded as before.

This module drives the admitter (its pool, claim and load lock), which sits above the load level
(tests/test_layers.py): it names the admitter's type only, and imports no admission module at run time. It
belongs behind the one admission step, with the proxy's other calls into admission (issue 24, point 1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from gateway import dialects
from gateway.backends import Backend
from gateway.config.settings import Settings
from gateway.domain import KV_OPERATIONS, BackendKind, Dialect, ParsedRequest, Rewrites
from gateway.fitting.rewrite import apply_rewrites, encode_body
from gateway.loads.keep_alive import HEADER, carries_admin_key, client_keep_alive, unloads

if TYPE_CHECKING:  # the type only (module docstring)
    from gateway.admission.admit import Admitter


def keep_alive_of(headers: Mapping[str, str], path: str, raw: bytes, parsed: ParsedRequest, settings: Settings,
                  ) -> tuple[bytes, ParsedRequest, dict[str, str]]:  # fmt: skip
    """A client's keep_alive 0 or negative, the admin's only (loads/keep_alive.py): the body to forward, as
    parsed, and the header that says what was done."""
    if parsed.dialect is not Dialect.OLLAMA or "keep_alive" not in parsed.body:
        return raw, parsed, {}
    verdict = client_keep_alive(parsed.body, settings.residency.client_keep_alive,
                                admin=carries_admin_key(headers, settings.server.admin_key))
    if verdict.body is None or verdict.note is None:
        return raw, parsed, {}
    changed = dialects.parse(parsed.dialect, parsed.operation, verdict.body, path)
    return encode_body(verdict.body), changed, {HEADER: verdict.note}


Forward = Callable[[bytes], Awaitable[web.StreamResponse]]


def is_load_request(parsed: ParsedRequest, backend: Backend) -> bool:
    """An Ollama chat or generate that runs nothing: it loads (or, with keep_alive 0, unloads) the model."""
    return (backend.kind is BackendKind.OLLAMA and parsed.operation in KV_OPERATIONS and not parsed.allocates_kv
            and bool(parsed.model))


async def serve_load_request(admitter: Admitter, backend: Backend, model: str | None, parsed: ParsedRequest,
                             raw: bytes, forward: Forward, *, pin_num_ctx: bool) -> web.StreamResponse:
    """Forward a load or unload request through the load gate (module docstring)."""
    try:
        if unloads(parsed.body):
            async with admitter.load_lock(backend):
                return await forward(raw)
        pool = await admitter.pool_for(backend, model)  # loads through the GPU check; 503 when it can't
        claim = admitter.claim(backend, pool)
        try:
            body = None
            if pool is not None and pin_num_ctx and parsed.num_ctx_field is not None:
                body, _ = apply_rewrites(parsed, Rewrites(num_ctx=pool.slot_ctx_tokens))
            return await forward(raw if body is None else encode_body(body))
        finally:
            claim.release()
    finally:
        admitter.model_may_have_reloaded(backend, parsed.model)
