"""The KV pool each (backend, model) runs with: per-sequence context, slots, unified or split.

    Ollama        split: num_parallel slots of num_ctx tokens. num_ctx is pinned: the backend's configured
                  ``context_tokens``, never below what /api/ps shows loaded, else the Modelfile's num_ctx, else
                  ``admission.default_context_tokens``.
    llama-server  from /props (per-slot n_ctx, total_slots); unified unless ``unified_kv = false`` (it is the
                  server's default when -np is omitted, and the safe assumption: every slot then shares one pool).
    openai        unknown: no admission.

Layouts are cached for ``admission.pool_refresh_s``; a backend that can't be probed gets no admission (logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.admission import PoolSpec
from gateway.backends import Backend
from gateway.config import Settings
from gateway.domain import BackendKind
from gateway.knowledge import Knowledge
from gateway.memory.estimate import estimate
from gateway.memory.kv import CTX_PAD_TOKENS, parse_cache_type
from gateway.memory.prober import ProbeError
from gateway.memory.vram import VramUnavailable

log = logging.getLogger(__name__)


class PoolDirectory:
    def __init__(self, settings: Settings, knowledge: Knowledge, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._knowledge = knowledge
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, PoolSpec | None]] = {}
        self._failures: dict[tuple[str, str], str] = {}

    async def pool_for(self, backend: Backend, model: str) -> PoolSpec | None:
        key = (backend.name, model)
        cached = self._cache.get(key)
        now = self._clock()
        if cached is not None and now - cached[0] < self._settings.admission.pool_refresh_s:
            return cached[1]
        try:
            pool = await self._probe(backend, model)
        except (ProbeError, LookupError, ValueError) as exc:
            if self._failures.get(key) != str(exc):  # once per reason, not every refresh
                log.warning("no KV pool for model %r on %s, admitting without a ledger: %s", model,
                            backend.describe(), exc)
            self._failures[key] = str(exc)
            pool = None
        else:
            self._failures.pop(key, None)
        self._cache[key] = (now, pool)
        return pool

    async def _probe(self, backend: Backend, model: str) -> PoolSpec | None:
        settings = backend.settings
        if backend.kind is BackendKind.OLLAMA:
            loaded = await self._knowledge.loaded_context(backend, model)
            context = settings.context_tokens
            if context is None or (loaded is not None and loaded > context):
                context = loaded or context
            if context is None:
                context = await self._auto_context(backend, model)
            return PoolSpec.split_pool(backend.name, model, str(backend.kind), slot_ctx_tokens=context,
                                       slots=settings.parallel or 1)
        if backend.kind is BackendKind.LLAMA_SERVER:
            profile = await self._knowledge.profile(backend, model)
            if profile.context_tokens is None:
                raise LookupError("llama-server /props reported no per-slot context")
            slots = profile.parallel or settings.parallel or 1
            if settings.unified_kv is False:
                return PoolSpec.split_pool(backend.name, model, str(backend.kind),
                                           slot_ctx_tokens=profile.context_tokens, slots=slots)
            return PoolSpec.unified_pool(backend.name, model, pool_tokens=profile.context_tokens, slots=slots)
        return None

    async def _auto_context(self, backend: Backend, model: str) -> int:
        """The Modelfile's num_ctx; else the largest context (to a cap) that fits free VRAM beside what runs."""
        config = self._settings.admission
        profile = await self._knowledge.profile(backend, model)
        if profile.context_tokens:
            return profile.context_tokens
        try:
            reading = await self._knowledge.vram(backend)
        except VramUnavailable as exc:
            log.info("no VRAM reading for %s (%s); context defaults to %d", backend.describe(), exc,
                     config.default_context_tokens)
            reading = None
        if reading is None:
            return config.default_context_tokens
        cap = min(config.max_auto_context_tokens, profile.shape.n_ctx_train or config.max_auto_context_tokens)
        settings = backend.settings
        fit = estimate(
            profile, context=cap, parallel=settings.parallel or 1, type_k=parse_cache_type(settings.cache_type_k),
            type_v=parse_cache_type(settings.cache_type_v), vram_total_bytes=reading.total_bytes,
            vram_free_bytes=reading.free_bytes,
        )
        context = min(cap, fit.max_context_tokens or 0)
        if context < CTX_PAD_TOKENS:
            raise LookupError(f"model {model!r} does not fit in {reading.free_bytes / 2**30:.1f} GiB of free VRAM")
        log.info("pinning model %r on %s to a context of %d tokens (fits free VRAM)", model, backend.describe(),
                 context)
        return context

    def known(self) -> dict[tuple[str, str], PoolSpec]:
        """Every pool probed so far (for metrics and the status page)."""
        return {key: pool for key, (_, pool) in self._cache.items() if pool is not None}

    def forget(self, backend: Backend, model: str) -> None:
        """Drop a cached layout (after the backend reported a context error, say)."""
        self._cache.pop((backend.name, model), None)
