"""Ollama's load and unload requests through the load gate (issue 23, point 4).

A chat without messages or a generate without a prompt reserves no KV: before issue 23 it went straight to the
backend, so a plain client could load a model beside a foreign process (out of memory), evict what others run on,
or make Ollama reload a model at another context. Now:

    load request      the model is loaded through the GPU check (the pool: the load gate's decision,
                      unloads and lowered context, or 503 ``gpu_memory_exhausted`` with Retry-After), then the
                      request is forwarded with ``options.num_ctx`` pinned to the loaded context (the backend
                      answers at once, nothing reloads), the model held resident while it runs
    unload request    (``keep_alive`` 0, which only the admin's request still carries: loads/keep_alive.py)
                      forwarded under the backend's load lock, so it never lands in the middle of kvgate's own
                      decision and load

Without admission, or on a backend with no pool to read, it is forwarded as before.

This module tells a load request from others and takes a client's keep_alive off; the load itself goes through
the admission step (``AdmissionStep.load`` and ``AdmissionStep.unloading``, gateway/admission/step.py), like every
other call the proxy makes into admission.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway import dialects
from gateway.backends import Backend
from gateway.config.settings import Settings
from gateway.domain import KV_OPERATIONS, Dialect, ParsedRequest
from gateway.fitting.rewrite import encode_body
from gateway.loads.keep_alive import HEADER, carries_admin_key, client_keep_alive


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


def is_load_request(parsed: ParsedRequest, backend: Backend) -> bool:
    """An Ollama chat or generate that runs nothing: it loads (or, with keep_alive 0, unloads) the model."""
    return (backend.runtime.empty_request_loads and parsed.operation in KV_OPERATIONS and not parsed.allocates_kv
            and bool(parsed.model))
