"""The KV pool each backend runs a model with: per-sequence context, slots, unified or split.

    Ollama        split: num_parallel slots of num_ctx tokens, one pool per model it lists. The context is what
                  /api/ps shows loaded. A model not loaded yet is loaded first (an empty /api/generate, with the
                  backend's ``context_tokens`` if configured, else Ollama's own default, exactly as a /v1 client
                  would load it) and read back, so /api and /v1 clients share one loaded context and the first
                  request is planned against the context that really runs. Only when that fails: the configured
                  ``context_tokens``, the Modelfile's num_ctx, or the largest context that fits free VRAM. The slots:
                  ``parallel`` when configured, else read from the model's /api/ps size at every probe, so after
                  every load and reload (pool_slots.py, gateway.memory.ollama_slots).
    llama-server  one pool per server, whatever model name a request says (it serves one model): per-slot n_ctx
                  and total_slots from /props, no model file needed; unified unless ``unified_kv = false`` (the
                  server's default when -np is omitted, and the safe assumption: every slot then shares one pool).
    openai        one pool per server from configuration (``parallel`` and ``context_tokens``, ``unified_kv``);
                  without them the backend is forwarded without admission, and says so at start-up and on the
                  status page.

Which of these a backend has is its runtime's ``pool_source`` (gateway/runtimes/): the per-model pools of the models
it shows loaded, the server's /props, or configuration.

A layout is reused for ``admission.pool_refresh_s``, or until a response may have changed it (``mark_stale``).
Past ``REFRESH_AHEAD_AT`` of that period, a request served the layout starts its re-read beside it (a read-ahead,
which never loads a model), so steady traffic never waits for a refresh; a layout is still never used older than
the period. Several requests never start several probes of one pool: they share one. A probe that fails is retried
for up to ``admission.probe_wait_s`` while its requests wait; then they are refused with 503 and Retry-After, never
admitted without a ledger. A pool probed before keeps its last layout while a refresh fails.

A backend that refuses connections and answered nothing within ``probe_wait_s`` is down: 502 (``BackendDown``) at
once, not a wait (gateway/backends/liveness.py); one that answered within that time is waited for, as above.

"Could not probe" and "does not fit" are different answers. A backend that is unreachable or answers nonsense
(``ProbeError``) is retried, then refused with 503, as above. A model that does not fit free VRAM, or whose profile
can't be derived, is a decision with numbers (:class:`ModelDoesNotFit`, :class:`ContextUnknown`): the pool is planned
with ``admission.default_context_tokens``, the reason is logged once and kept as a note (``notes_for``) that every
admission outcome in that pool carries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from gateway.admission import PoolSpec
from gateway.admission.pool_slots import SlotBook, read_slots
from gateway.backends import Backend
from gateway.backends.down import down_error
from gateway.backends.prober import ProbeError, ProfileUnderivable
from gateway.backends.probes import BackendProbes
from gateway.config.settings import Settings
from gateway.errors import BackendNotReady
from gateway.loads.gate import Loaded, LoadGate, Lowered, lowered_of
from gateway.loads.offload import Offloads
from gateway.memory.fit_estimate import VramRoom, estimate
from gateway.memory.kv import CTX_PAD_TOKENS
from gateway.memory.load_cost import RunKnobs
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.memory.vram import VramUnavailable
from gateway.runtimes import PoolSource, runtime_for

log = logging.getLogger(__name__)

PROBE_RETRY_FIRST_S = 0.25
PROBE_RETRY_MAX_S = 2.0
REFRESH_AHEAD_AT = 0.8
"""The share of ``admission.pool_refresh_s`` after which a request that finds a fresh layout re-reads it beside
itself (every 5 s: ~2M instructions and two HTTP calls to Ollama that some request's wait would otherwise hold)."""
PoolId = tuple[str, str]
"""(backend name, model as the backend names it; "" for servers of one pool)."""


@dataclass(frozen=True, slots=True)
class ModelDoesNotFit:
    """The model's weights with even the smallest context need more than the free VRAM."""

    needed_bytes: int
    free_bytes: int
    context_tokens: int

    def describe(self) -> str:
        return (f"it does not fit free VRAM: {self.needed_bytes / 2**30:.1f} GiB needed at a context of "
                f"{self.context_tokens} tokens, {self.free_bytes / 2**30:.1f} GiB free")


@dataclass(frozen=True, slots=True)
class ContextUnknown:
    """No context can be derived: no VRAM reading, or no profile of the model."""

    reason: str

    def describe(self) -> str:
        return self.reason


NoContext = ModelDoesNotFit | ContextUnknown


class _NotLoaded(Exception):
    """A read-ahead found the model no longer loaded (it loads nothing: that is the next probe's to do)."""


def unadmitted_reason(backend: Backend) -> str | None:
    """Why a backend is forwarded without admission, or None when kvgate admits its requests (its runtime's)."""
    return runtime_for(backend).unadmitted_reason(backend)


class PoolDirectory:
    def __init__(
        self,
        settings: Settings,
        probes: BackendProbes,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        loads: LoadGate | None = None,
    ) -> None:
        self._settings = settings
        self._probes = probes
        self._loads = loads
        self._lowered: dict[PoolId, Lowered] = {}
        self._offloaded = Offloads()
        if loads is not None:
            loads.on_change = lambda backend, model: self._stale.add((backend, model))
            loads.on_changes_missed = lambda: self._stale.update(self._cache)
        self._clock = clock
        self._sleep = sleep
        self._cache: dict[PoolId, tuple[float, PoolSpec]] = {}
        self._probing: dict[PoolId, asyncio.Future[PoolSpec]] = {}
        self._reading_ahead: dict[PoolId, asyncio.Future[PoolSpec | None]] = {}
        self._stale: set[PoolId] = set()
        self._checking_default: set[PoolId] = set()
        self._default_confirmed: set[PoolId] = set()
        self._failures: dict[PoolId, str] = {}
        self._context_notes: dict[PoolId, str] = {}
        self.disagreements: dict[PoolId, str] = {}
        """Configured contexts the backend's loaded models disagree with (for the status page)."""
        self.slots = SlotBook()
        """Where each pool's slot count came from; an Ollama backend's parallel as last inferred (pool_slots.py)."""
        if loads is not None:
            loads.parallel_for = self.slots.parallel_guess
        self.probes = 0
        """Probes started (for tests: concurrent requests share one)."""

    async def pool_for(self, backend: Backend, model: str | None) -> PoolSpec | None:
        """The pool a request lands in; None only for a backend forwarded without admission. ``model`` is the
        backend's own name for an Ollama model (the registry resolves it); the other kinds ignore it."""
        if unadmitted_reason(backend) is not None:
            return None
        runtime = runtime_for(backend)
        if runtime.pool_source is PoolSource.CONFIGURED:
            return self._configured(backend)
        pool_id = (backend.name, runtime.pool_model(model))
        cached = self._cache.get(pool_id)
        if cached is not None and pool_id not in self._stale:
            age_s, refresh_s = self._clock() - cached[0], self._settings.admission.pool_refresh_s
            if age_s < refresh_s:
                if age_s >= refresh_s * REFRESH_AHEAD_AT and pool_id not in self._probing:
                    self._start_read_ahead(backend, pool_id)
                return cached[1]
        ahead = self._reading_ahead.get(pool_id)
        if ahead is not None and pool_id not in self._stale:  # past the period while a read-ahead runs: join it
            found = await asyncio.shield(ahead)
            if found is not None and pool_id not in self._stale:
                return found
        running = self._probing.get(pool_id)
        if running is None:
            running = asyncio.ensure_future(self._probe_until_ready(backend, pool_id))
            self._probing[pool_id] = running
            running.add_done_callback(lambda _: self._probing.pop(pool_id, None))
        return await asyncio.shield(running)

    def _start_read_ahead(self, backend: Backend, pool_id: PoolId) -> None:
        if pool_id in self._reading_ahead:
            return
        task = asyncio.ensure_future(self._read_ahead(backend, pool_id))
        self._reading_ahead[pool_id] = task

        def done(_: asyncio.Future[PoolSpec | None]) -> None:
            self._reading_ahead.pop(pool_id, None)
            if not task.cancelled() and task.exception() is not None:  # joined by no request: said here
                log.warning("re-reading the KV pool of %s failed: %r", _label(backend, pool_id[1]), task.exception())

        task.add_done_callback(done)

    async def _read_ahead(self, backend: Backend, pool_id: PoolId) -> PoolSpec | None:
        """A re-read of a layout that is still fresh: the new layout, or None when it can't be read now (the
        backend does not answer, or the model is no longer loaded). Then the first request past the refresh period
        probes as before (and waits, loading the model if need be); the layout in use is left as it was."""
        self.probes += 1
        try:
            pool = await self._probe(backend, pool_id[1], load=False)
        except (ProbeError, _NotLoaded):
            return None
        if pool_id in self._stale:  # marked while it read: this answer may predate the change
            return None
        self._failures.pop(pool_id, None)
        self._store(pool_id, pool)
        return pool

    async def aclose(self) -> None:
        """At shutdown: the probes shared by waiting requests (shielded from any one request's cancellation) end
        here, their connections closed, rather than running on into a closed session."""
        running: list[asyncio.Future[Any]] = [*self._probing.values(), *self._reading_ahead.values()]
        for probe in running:
            probe.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    def mark_stale(self, backend: Backend, model: str) -> None:
        """The next request re-reads the layout (after a response that may have loaded or reloaded the model)."""
        self._stale.add((backend.name, model))

    def after_default_load(self, backend: Backend, model: str) -> None:
        """After a request that runs the model at Ollama's own default context (a /v1 request, which can't carry
        num_ctx, reloads a model loaded at another one): re-read the layout, until a re-read shows the default is
        the context it runs with; from then on /v1 requests cost no extra probe."""
        pool_id = (backend.name, model)
        if pool_id not in self._default_confirmed:
            self._stale.add(pool_id)
            self._checking_default.add(pool_id)

    async def _probe_until_ready(self, backend: Backend, pool_id: PoolId) -> PoolSpec:
        deadline = self._clock() + self._settings.admission.probe_wait_s
        pause_s = PROBE_RETRY_FIRST_S
        while True:
            self.probes += 1
            try:
                pool = await self._probe(backend, pool_id[1])
            except ProbeError as exc:
                reason = str(exc) or type(exc).__name__
                cached = self._cache.get(pool_id)
                if self._failures.get(pool_id) != reason:  # once per reason, not every refresh
                    log.warning("could not learn the KV pool of %s: %s", _label(backend, pool_id[1]), reason)
                self._failures[pool_id] = reason
                if cached is not None:
                    return cached[1]  # the last layout stands while the backend is briefly unreachable
                down = down_error(backend, exc, self._settings.admission.probe_wait_s)
                if down is not None and pause_s == PROBE_RETRY_FIRST_S:  # down: answered on its first refusal
                    raise down from None
                if self._clock() + pause_s > deadline:
                    raise BackendNotReady(
                        f"kvgate can't learn the KV pool of {_label(backend, pool_id[1])} (tried for "
                        f"{self._settings.admission.probe_wait_s:g} s, admission.probe_wait_s): {reason}; requests "
                        "are not forwarded unaccounted; retry shortly", retry_after_s=PROBE_RETRY_MAX_S,
                    ) from None
                await self._sleep(pause_s)
                pause_s = min(pause_s * 2, PROBE_RETRY_MAX_S)
                continue
            if self._failures.pop(pool_id, None) is not None:
                log.info("learned the KV pool of %s again", _label(backend, pool_id[1]))
            self._store(pool_id, pool)
            self._stale.discard(pool_id)
            return pool

    def _store(self, pool_id: PoolId, pool: PoolSpec) -> None:
        previous = self._cache.get(pool_id)
        if previous is not None and previous[1] != pool:
            self._default_confirmed.discard(pool_id)
        elif previous is not None and pool_id in self._checking_default:
            self._default_confirmed.add(pool_id)
        self._checking_default.discard(pool_id)
        self._cache[pool_id] = (self._clock(), pool)

    async def _probe(self, backend: Backend, model: str, *, load: bool = True) -> PoolSpec:
        try:
            return await self._layout(backend, model, load)
        except ValueError as exc:  # numbers no pool can have (a context of 0 tokens): a bad answer
            raise ProbeError(f"{_label(backend, model)} reports an impossible KV layout: {exc}") from exc

    async def _layout(self, backend: Backend, model: str, load: bool) -> PoolSpec:
        if runtime_for(backend).pool_source is PoolSource.LOADED_MODEL:
            return await self._ollama_pool(backend, model, load)
        props = await self._probes.llama_props(backend)
        settings = backend.settings
        alias = props.model_alias if props.model_alias != props.model_path else ""  # the default alias is the path
        name = alias or PurePath(props.model_path).name or backend.name
        slots = self.slots.reported(backend, props.total_slots)
        if settings.unified_kv is False:
            return PoolSpec.split_pool(backend.name, name, backend.kind, slot_ctx_tokens=props.n_ctx_slot,
                                       slots=slots)
        return PoolSpec.unified_pool(backend.name, name, pool_tokens=props.n_ctx_slot, slots=slots)

    async def _ollama_pool(self, backend: Backend, model: str, load: bool) -> PoolSpec:
        settings = backend.settings
        gated = self._loads is not None and self._loads.applies(backend)
        if self._loads is not None and gated:
            async with self._loads.lock(backend).local:  # never read in the middle of kvgate's own unload
                entry = await self._probes.loaded_model(backend, model, join_running=False)
                if entry is not None:
                    self._loads.expect(backend.name, model)
        else:
            entry = await self._probes.loaded_model(backend, model, join_running=False)
        if entry is None and not load:
            raise _NotLoaded(model)
        if entry is None:
            entry = await self._load(backend, model)
            if entry is None and gated:
                # Never fall back to a context of kvgate's choosing here: a request pinned to it would make Ollama
                # load the model past the GPU check. The probe is retried (admission.probe_wait_s), then 503.
                raise ProbeError(f"{_label(backend, model)} is not loaded after kvgate loaded it")
        context = None if entry is None else entry.context_tokens
        if context is None and settings.context_tokens is None:
            context = await self._auto_context(backend, model)
        else:
            self._context_notes.pop((backend.name, model), None)
            if context is None:
                context = settings.context_tokens
            elif settings.context_tokens is not None and settings.context_tokens != context:
                self._note_disagreement(backend, model, context)
        assert context is not None
        slots = await read_slots(self.slots, self._probes, backend, model, entry)
        return PoolSpec.split_pool(backend.name, model, backend.kind, slot_ctx_tokens=context, slots=slots)

    async def _load(self, backend: Backend, model: str) -> LoadedModel | None:
        """Load the model as any client would (Ollama's load request), then read it back from /api/ps. With load
        admission (``LoadGate``), the load waits for GPU memory, unloads idle models, or loads at a lowered context;
        a load that can't fit raises LoadRefused (503)."""
        try:
            if self._loads is not None and self._loads.applies(backend):
                loaded = await self._loads.load(backend, model)
                self._after_gate(backend, model, loaded)
                if loaded is None:
                    await self._probes.load_model(backend, model, backend.settings.context_tokens)
            else:
                await self._probes.load_model(backend, model, backend.settings.context_tokens)
        except ProbeError as exc:
            log.warning("could not load model %r on %s to learn its context: %s", model, backend.describe(), exc)
            return None
        entry = await self._probes.loaded_model(backend, model, join_running=False)
        if entry is not None and entry.context_tokens is not None:
            log.info("model %r on %s loaded with a context of %d tokens", model, backend.describe(),
                     entry.context_tokens)
        return entry

    def _after_gate(self, backend: Backend, model: str, loaded: Loaded | None) -> None:
        """The models the gate unloaded are read anew; the model's lowered context is remembered, or forgotten."""
        for name in () if loaded is None else loaded.decision.unload:
            self._stale.add((backend.name, name))
        lowered = lowered_of(loaded)
        if lowered is None:
            self._lowered.pop((backend.name, model), None)
        else:
            self._lowered[(backend.name, model)] = lowered
        if loaded is not None:
            self._offloaded.after_load(backend.name, model, loaded.decision)

    async def before_default_request(self, backend: Backend, pool: PoolSpec) -> PoolSpec:
        """Before a request that runs the model at Ollama's own default context (/v1, no num_ctx): when kvgate loaded
        it at a context lowered from that default, the request would make Ollama reload it there, past the GPU
        check. So kvgate reloads it at the default itself, through the gate (idle models unloaded first), and the
        request is planned in the new pool; when the default can't fit, LoadRefused (503) says what to do."""
        lowered = self.lowered_for(pool)
        if lowered is None or not lowered.at_default or self._loads is None:
            return pool
        loaded = await self._loads.load(backend, pool.model, at_default=True)
        self._after_gate(backend, pool.model, loaded)
        self._stale.add((backend.name, pool.model))
        found = await self.pool_for(backend, pool.model)
        return pool if found is None else found

    async def check_configured(self, backend: Backend) -> None:
        """At start-up: report models an Ollama backend already has loaded at another context than its configured
        ``context_tokens`` (kvgate will follow them); a backend that can't be asked is checked on first use."""
        configured = backend.settings.context_tokens
        if not runtime_for(backend).lists_loaded_models or configured is None:
            return
        try:
            loaded = await self._probes.loaded_models(backend)
        except ProbeError:
            return
        for model in loaded:
            if model.context_tokens is not None and model.context_tokens != configured:
                self._note_disagreement(backend, model.name, model.context_tokens)

    def _note_disagreement(self, backend: Backend, model: str, loaded: int) -> None:
        message = (f"{backend.describe()} has context_tokens = {backend.settings.context_tokens} but model {model!r} "
                   f"is loaded with {loaded}; kvgate follows the loaded context (pinning another one would reload "
                   "the model for every client that can't send num_ctx)")
        key = (backend.name, model)
        if self.disagreements.get(key) != message:
            log.warning("%s", message)
        self.disagreements[key] = message

    def _configured(self, backend: Backend) -> PoolSpec:
        settings = backend.settings
        assert settings.parallel is not None and settings.context_tokens is not None
        self.slots.reported(backend, None)
        if settings.unified_kv:
            return PoolSpec.unified_pool(backend.name, "", pool_tokens=settings.context_tokens,
                                         slots=settings.parallel, backend_kind=backend.kind)
        return PoolSpec.split_pool(backend.name, "", backend.kind, slot_ctx_tokens=settings.context_tokens,
                                   slots=settings.parallel)

    async def _auto_context(self, backend: Backend, model: str) -> int:
        """The context a model nothing else names is planned with: what :meth:`_fit_context` finds, else (it does not
        fit, or nothing can be derived) ``admission.default_context_tokens``, logged with the reason and kept as the
        pool's note."""
        pool_id = (backend.name, model)
        found = await self._fit_context(backend, model)
        if isinstance(found, int):
            self._context_notes.pop(pool_id, None)
            return found
        default = self._settings.admission.default_context_tokens
        note = (f"{_label(backend, model)}: {found.describe()}; planned with a context of {default} tokens "
                "(admission.default_context_tokens)")
        if self._context_notes.get(pool_id) != note:  # once per reason, not every refresh
            log.log(logging.WARNING if isinstance(found, ModelDoesNotFit) else logging.INFO, "%s", note)
        self._context_notes[pool_id] = note
        return default

    async def _fit_context(self, backend: Backend, model: str) -> int | NoContext:
        """The Modelfile's num_ctx; else the largest context (to a cap) that fits free VRAM beside what runs. Raises
        ProbeError only when the backend can't be asked."""
        config = self._settings.admission
        try:
            profile = await self._probes.profile(backend, model)
        except (ProfileUnderivable, LookupError) as exc:  # the backend answered; asking again won't help
            return ContextUnknown(f"its profile can't be derived ({exc})")
        if profile.context_tokens:
            return profile.context_tokens
        try:
            reading = await self._probes.vram(backend)
        except VramUnavailable as exc:
            return ContextUnknown(f"no VRAM reading ({exc})")
        if reading is None:
            return ContextUnknown("no VRAM source is configured (the backend's vram setting)")
        cap = min(config.max_auto_context_tokens, profile.shape.n_ctx_train or config.max_auto_context_tokens)
        settings = backend.settings
        parallel = self.slots.parallel_guess(backend, profile)
        try:
            fit = estimate(
                profile,
                context=cap,
                parallel=parallel,
                knobs=RunKnobs(type_k=settings.cache_type_k, type_v=settings.cache_type_v),
                vram=VramRoom(total_bytes=reading.total_bytes, free_bytes=reading.free_bytes),
            )
            smallest = estimate(
                profile,
                context=CTX_PAD_TOKENS,
                parallel=parallel,
                knobs=RunKnobs(type_k=settings.cache_type_k, type_v=settings.cache_type_v),
            )
        except ValueError as exc:
            return ContextUnknown(f"its memory can't be estimated ({exc})")
        context = min(cap, fit.max_context_tokens or 0)
        if context < CTX_PAD_TOKENS:
            return ModelDoesNotFit(smallest.cost.total_bytes, reading.free_bytes, CTX_PAD_TOKENS)
        log.info("pinning model %r on %s to a context of %d tokens (fits free VRAM)", model, backend.describe(),
                 context)
        return context

    def notes_for(self, pool: PoolSpec) -> tuple[str, ...]:
        """What operators should know about how the pool's context was chosen (a fallback and its reason)."""
        note = self._context_notes.get((pool.backend, pool.model))
        return () if note is None else (note,)

    def lowered_for(self, pool: PoolSpec) -> Lowered | None:
        """The context kvgate lowered the pool's model to, to fit GPU memory, while it is loaded that way."""
        lowered = self._lowered.get((pool.backend, pool.model))
        return lowered if lowered is not None and lowered.loaded_tokens == pool.slot_ctx_tokens else None

    def expected_load_s(self, backend: Backend, model: str) -> tuple[float, str] | None:
        """The expected load of ``model`` on ``backend``, from the loads kvgate asked for (backends/load_times.py)."""
        return self._probes.load_times.expected_s(backend.name, model)

    def offload_for(self, pool: PoolSpec) -> str | None:
        """What of the pool's model runs on the CPU, for X-Kvgate-Offload (loads/offload.py: Offloads)."""
        if not runtime_for(pool.backend_kind).lists_loaded_models:  # what runs on the CPU is in /api/ps
            return None
        return self._offloaded.said(pool.backend, pool.model, self._probes.on_cpu(pool.backend, pool.model))

    def known(self) -> dict[tuple[str, str], PoolSpec]:
        """Every pool probed so far, by (backend, model) (for metrics and the status page)."""
        return {pool.key: pool for _, pool in self._cache.values()}


def _label(backend: Backend, model: str) -> str:
    return f"model {model!r} on {backend.describe()}" if model else backend.describe()
