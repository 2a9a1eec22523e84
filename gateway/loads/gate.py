"""The load gate, live: the I/O around ``plan.decide_load`` (may a model load now, and what it unloads first).

An Ollama model that is not resident is loaded by kvgate itself (the pool directory's load, before the first request
that needs it is planned). On a backend with a ``vram`` source, ``LoadGate.load`` first decides whether the load may
happen, with the backend's live ``GpuBudget`` (``gpu_reading``), the loads in flight (``LoadReservations``), kvgate's
own active sequences on each resident model (the waiting room's ledger), when each was last used and loaded, and the
per-model ``pin`` and ``priority``:

    LOAD     unload the idle models the decision names (``keep_alive: 0``, then /api/ps until they are gone), reserve
             the load's bytes, load at the decided context (lowered: logged once and reported by ``lowered``), release
    WAIT     poll every ``LOAD_POLL_S`` (the lock released meanwhile) until the decision changes, at most
             ``residency.load_wait_s``; then 503 like a refusal
    REFUSE   503 ``gpu_memory_exhausted`` with Retry-After, naming the model, the bytes needed and the bytes free

Decisions and loads on one backend are serialised (Ollama itself loads one model at a time), so two requests for two
models that are not loaded never start two loads that together don't fit.

A load refused for lack of GPU memory then meets ``residency.when_gpu_full`` (offload.py): by default it runs
partly on the CPU, as the backend would, where it does (``cpu_offload``) and system RAM holds it; ``wait`` waits
``load_wait_s`` for GPU memory, ``refuse`` answers 503 at once. A spilled load that fails teaches kvgate that the
backend does not offload (a warning says to set ``cpu_offload = "off"``).

An embedding model (``capabilities`` without ``completion``) is loaded as Ollama's embed clients load it (an empty
``/api/embed``) and costs its weights and compute only: Ollama runs it alone (parallel 1) with no KV cache.
``ensure_loaded`` is what an embedding request asks (it reserves no KV, ``sequence_rules``): the model loaded
through the gate when /api/ps does not list it.

Without a ``vram`` source, on other backend kinds, with ``residency.enabled = false``, or when the model's profile
can't be had, ``load`` answers None and the caller loads as before.

For routing, ``preview`` asks the same question without acting on it (preview.py): with the last GPU reading
and /api/ps (read at most once per ``vram_refresh_s`` per backend and model), no lock, no claim, no load; and
``resident`` says whether the last /api/ps kvgate read from a backend (for any purpose) listed a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from gateway.backends import Backend
from gateway.backends.model_names import canonical_model, find_model, name_candidates, same_model
from gateway.backends.prober import ProbeError, ProfileUnderivable
from gateway.backends.probes import BackendProbes
from gateway.config.settings import ModelSettings, Settings
from gateway.errors import LoadRefused
from gateway.loads.backend_lock import BackendLock
from gateway.loads.gpu_ledger import GpuBudget, GpuEntry, LoadReservations
from gateway.loads.gpu_reading import read_gpu_entry
from gateway.loads.offload import CpuOffload, FullGpu, SpillTarget, when_full
from gateway.loads.oom import names_gpu_oom, oom_refusal
from gateway.loads.plan import (
    GpuRoom,
    LoadAction,
    LoadAsk,
    LoadDecision,
    ResidentState,
    decide_load,
)
from gateway.loads.preview import RESIDENT, LoadPreview, preview_of
from gateway.loads.shared_gpu import SharedGpu
from gateway.memory.load_cost import RunKnobs, estimate_load_cost
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.ollama_answers import default_context_tokens
from gateway.memory.vram import VramUnavailable
from gateway.support.single_flight import SingleFlight

log = logging.getLogger(__name__)

LOAD_POLL_S = 0.25
"""How often a waiting load asks again."""
UNLOAD_WAIT_S = 10.0
"""How long kvgate waits for /api/ps to stop listing a model it unloaded (Ollama waits up to 5 s for VRAM)."""
_AT_DEFAULT_HINT = (
    "kvgate loaded it at a lowered context to fit, and an OpenAI-style (/v1) request would make Ollama reload it at "
    "its default context (/v1 can't carry num_ctx): use Ollama's own /api/chat or /api/generate, or set "
    "OLLAMA_CONTEXT_LENGTH on the server to a context that fits and the backend's context_tokens in kvgate to match"
)
GPUS_PER_DEFAULT_SLOT = 3
"""Ollama's OLLAMA_MAX_LOADED_MODELS default: 3 per GPU."""


@dataclass(slots=True)
class LoadCounts:
    """What the gate did on one backend, since start (the metrics and the status page)."""

    loads: int = 0
    unloads: int = 0
    lowered: int = 0
    waited: int = 0
    refused: int = 0


class Claim:
    """A request's hold on the model it runs on (``LoadGate.claim``); ``release`` is idempotent."""

    def __init__(self, gate: LoadGate, key: tuple[str, str]) -> None:
        self._gate: LoadGate | None = gate
        self._key = key

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._unclaim(self._key)


@dataclass(frozen=True, slots=True)
class Loaded:
    """What ``LoadGate.load`` did: the decision, and whether the context asked for was named (configured, or the
    Modelfile's num_ctx) rather than Ollama's own default."""

    decision: LoadDecision
    explicit: bool


@dataclass(frozen=True, slots=True)
class Lowered:
    """A model loaded at a smaller context than asked, to fit GPU memory; ``at_default``: the asked one was Ollama's
    own default (so a /v1 request would reload it there)."""

    model: str
    asked_tokens: int
    loaded_tokens: int
    reason: str
    at_default: bool


class ActiveSequences(Protocol):
    """What the load level reads of the sequence level: kvgate's active sequences on (backend, model), every
    replica's with a shared ledger, and a way to read the other replicas' afresh before a decision. The waiting
    room is one (admission/waiting_room.py); a Protocol here keeps the dependency one way, admission -> loads."""

    def active_sequences(self, backend: str, model: str) -> int: ...

    async def refresh_active(self, backend: str, models: Sequence[str]) -> None: ...


class LoadGate:
    def __init__(
        self,
        settings: Settings,
        probes: BackendProbes,
        room: ActiveSequences,
        reservations: LoadReservations,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        shared_gpu: SharedGpu | None = None,
    ) -> None:
        self._settings = settings
        self._probes = probes
        self._room = room
        self._reservations = reservations
        self._clock = clock
        self._sleep = sleep
        self.shared_gpu = shared_gpu
        """The GPU leases across replicas (``[shared_ledger]``), None for one kvgate alone (shared_gpu.py)."""
        self._locks: dict[str, BackendLock] = {}
        self._loaded_elsewhere: dict[tuple[str, str], float] = {}
        """When another replica last loaded each (backend, model), on this replica's clock (from the lease)."""
        self._last_used: dict[tuple[str, str], float] = {}
        self._loaded_at: dict[tuple[str, str], float] = {}
        self._expected_at: dict[tuple[str, str], float] = {}
        self._claims: dict[tuple[str, str], int] = {}
        self._previews: SingleFlight[tuple[str, str], tuple[ModelProfile, GpuEntry | None]] = SingleFlight(
            clock=clock)
        """The inputs of ``preview``, per (backend, model): read at most once per ``vram_refresh_s``."""
        self.parallel_for: Callable[[Backend, ModelProfile], int] = lambda backend, _: backend.settings.parallel or 1
        """The sequences a model will be loaded with (the pool directory's: configured, else as inferred)."""
        self.cpu_offload = CpuOffload()
        """Whether each backend loads a model partly on the CPU, as kvgate learned it."""
        self.on_change: Callable[[str, str], None] = lambda backend, model: None
        """Called (backend, model) when a model's residency changes: just before kvgate unloads it, or when another
        replica announces it loaded or unloaded it (shared_gpu.py). Its pool is read anew by the next request."""
        self.on_changes_missed: Callable[[], None] = lambda: None
        """Called when another replica's changes may have been missed (the announcements were lost a while): every
        pool is read anew."""
        self.counts: dict[str, LoadCounts] = {}
        """Per backend: what kvgate loaded, unloaded, lowered, made wait and refused."""

    async def follow_other_replicas(self) -> None:
        """Until cancelled (with a shared GPU ledger; at once without): hear what the other replicas load and unload,
        and have those models' pools read anew (``on_change``)."""
        if self.shared_gpu is not None:
            await self.shared_gpu.follow(self._changed_elsewhere, lambda: self.on_changes_missed())

    def _changed_elsewhere(self, backend: str, models: tuple[str, ...]) -> None:
        for model in models:
            self.on_change(backend, model)

    async def aclose(self) -> None:
        """End a shared preview read still in flight (at shutdown)."""
        await self._previews.aclose()

    def _count(self, backend: Backend) -> LoadCounts:
        return self.counts.setdefault(backend.name, LoadCounts())

    @property
    def loads(self) -> int:
        return sum(c.loads for c in self.counts.values())

    @property
    def unloads(self) -> int:
        return sum(c.unloads for c in self.counts.values())

    def applies(self, backend: Backend) -> bool:
        return (self._settings.residency.enabled and backend.runtime.gates_loads
                and backend.settings.vram is not None)

    def touch(self, backend: str, model: str) -> None:
        """A request for ``model`` was served now (least recently used goes first)."""
        self._last_used[(backend, canonical_model(model))] = self._clock()

    def lock(self, backend: Backend) -> BackendLock:
        """Held while kvgate decides, unloads and loads on ``backend`` (with a shared ledger: while every replica
        does, backend_lock.py): a read of what is loaded taken under it is never in the middle of an unload."""
        lock = self._locks.get(backend.name)
        if lock is None:
            lock = self._locks[backend.name] = BackendLock(backend.name, self.shared_gpu,
                                                           self._settings.shared_ledger.on_unreachable)
        return lock

    def expect(self, backend: str, model: str) -> None:
        """Requests are on their way to ``model`` (its pool was just read): not unloaded before they claim it."""
        self._expected_at[(backend, canonical_model(model))] = self._clock()

    def claim(self, backend: str, model: str) -> Claim:
        """A request will run on ``model``: it is not unloaded until the claim is released (exactly once)."""
        key = (backend, canonical_model(model))
        self._claims[key] = self._claims.get(key, 0) + 1
        return Claim(self, key)

    def claimed(self) -> dict[tuple[str, str], int]:
        """The claims held now, per (backend, model): empty once every request is over."""
        return dict(self._claims)

    def _unclaim(self, key: tuple[str, str]) -> None:
        left = self._claims.get(key, 0) - 1
        if left > 0:
            self._claims[key] = left
        else:
            self._claims.pop(key, None)
        self._last_used[key] = self._clock()

    async def ensure_loaded(self, backend: Backend, model: str) -> Loaded | None:
        """``model`` resident on ``backend``: loaded through the gate when /api/ps (read now) does not list it; what
        ``load`` did, None when it was resident or no gate applies."""
        if not self.applies(backend):
            return None
        async with self.lock(backend).local:  # never read in the middle of kvgate's own unload
            if await self._probes.loaded_model(backend, model, join_running=False) is not None:
                self.expect(backend.name, model)
                return None
        return await self.load(backend, model)

    async def load(self, backend: Backend, model: str, *, at_default: bool = False) -> Loaded | None:
        """Load ``model`` once GPU memory allows (see the module docstring); the decision it loaded with, or None
        when no gate applies. Raises LoadRefused (503) when it can't, ProbeError when the backend can't be asked.

        ``at_default``: reload it at Ollama's own default context, never lowered (before a /v1 request, which can't
        carry num_ctx, reaches a model kvgate loaded at a lowered one)."""
        if not self.applies(backend):
            return None
        try:
            profile = await self._probes.profile(backend, model)
        except (ProfileUnderivable, LookupError) as exc:
            log.info("load of model %r on %s is not checked against GPU memory: its profile can't be derived (%s)",
                     model, backend.describe(), exc)
            return None
        deadline_s = self._clock() + self._settings.residency.load_wait_s
        announced, oom_retried = "", False
        lock = self.lock(backend)
        while True:
            async with lock:
                decision, asked_explicitly = await self._decide(backend, model, profile, at_default=at_default)
                if decision is None:
                    return None
                if decision.action is LoadAction.LOAD:
                    try:
                        await self._carry_out(backend, decision, explicit=asked_explicitly,
                                              embedding=profile.embedding_only)
                    except ProbeError as exc:  # out of memory after the check: decide again once (oom.py)
                        if not names_gpu_oom(500, str(exc)) or oom_retried:
                            raise oom_refusal(backend.describe(), model, str(exc), retried=True) \
                                if oom_retried else exc from None
                        oom_retried = True
                        log.warning("%s ran out of GPU memory after kvgate's check (%s); reading the GPU again",
                                    _label(backend, model), exc)
                        continue
                    return Loaded(decision, explicit=asked_explicitly)
                if decision.action is LoadAction.REFUSE or self._clock() >= deadline_s:
                    self._count(backend).refused += 1
                    raise self._refusal(backend, decision, at_default=at_default)
            if not announced:
                self._count(backend).waited += 1
            if decision.reason != announced:
                log.info("load of %s waits: %s", _label(backend, model), decision.describe())
                announced = decision.reason
            await self._sleep(min(LOAD_POLL_S, max(0.01, self._settings.residency.min_resident_s / 4)))

    async def decide_fresh(self, backend: Backend, model: str) -> LoadDecision | None:
        """What a load of ``model`` would be decided now, from a fresh GPU reading (None: no gate, or no profile)."""
        if not self.applies(backend):
            return None
        with contextlib.suppress(ProbeError, ProfileUnderivable, LookupError):
            profile = await self._probes.profile(backend, model)
            async with self.lock(backend):
                return (await self._decide(backend, model, profile, at_default=False))[0]
        return None

    def _refusal(self, backend: Backend, decision: LoadDecision, *, at_default: bool) -> LoadRefused:
        waited = (f" (waited {self._settings.residency.load_wait_s:g} s, residency.load_wait_s)"
                  if decision.action is LoadAction.WAIT else "")
        return LoadRefused(
            f"kvgate did not load {_label(backend, decision.model)}: it needs {decision.load_bytes:,} bytes of GPU "
            f"memory at a context of {decision.context_tokens} tokens and {max(0, decision.free_bytes):,} bytes are "
            f"free (after {self._settings.residency.headroom_bytes:,} bytes of residency.headroom_bytes); "
            f"{decision.reason}{waited}; {_AT_DEFAULT_HINT if at_default else 'retry later, or free GPU memory'}",
            retry_after_s=max(1.0, self._settings.residency.min_resident_s / 2),
        )

    async def _decide(
        self, backend: Backend, model: str, profile: ModelProfile, *, at_default: bool
    ) -> tuple[LoadDecision | None, bool]:
        """The decision now, and whether its context was asked for explicitly (configured, or the Modelfile's)."""
        with contextlib.suppress(VramUnavailable):  # read_gpu_entry reports it
            # a reading taken now, not one up to vram_refresh_s old: a process that took GPU memory since would
            # otherwise be missed, and the load planned into memory it holds (out of memory at load)
            await self._probes.vram(backend, taken_after_s=self._clock())
        held = self.lock(backend).held  # holding the lease, no other replica has a load in flight here
        entry = await read_gpu_entry(backend, self._probes, self._reservations,
                                     None if held is not None else self.shared_gpu)
        budget = None if entry is None else entry.budget
        if budget is None:
            problem = "no vram source" if entry is None else entry.problem
            log.warning("load of %s is not checked against GPU memory: %s", _label(backend, model), problem)
            return None, False
        if held is not None:  # what the other replicas loaded lately, and run now on what is resident
            now_s = self._clock()
            for other in held.loaded_elsewhere:
                self._loaded_elsewhere[(backend.name, canonical_model(other.model))] = now_s - other.age_s
            await self._room.refresh_active(backend.name, [m.name for m in budget.residents])
        if self._probes.partly_on_cpu(backend.name):
            self.cpu_offload.saw(backend.name, True, f"/api/ps showed {self._probes.partly_on_cpu(backend.name)} "
                                 "partly on the CPU")
        cpu = self.cpu_offload.verdict(backend, await self._probes.ollama_version(backend))
        return self._decision(backend, model, profile, budget, at_default=at_default, cpu=cpu)

    async def preview(self, backend: Backend, model: str) -> LoadPreview:
        """What loading ``model`` on ``backend`` would take now (preview.py), from the last GPU reading and
        /api/ps (at most ``vram_refresh_s`` old); no lock, no claim, nothing unloaded or loaded."""
        if not self.applies(backend):
            if backend.runtime.lists_loaded_models:  # no GPU reading: whether /api/ps lists it, at least
                with contextlib.suppress(ProbeError):
                    if any(same_model(m.name, model) for m in await self._probes.loaded_models(backend,
                                                                                               join_running=True)):
                        return RESIDENT
            return LoadPreview.unknown("no GPU check on this backend")
        try:
            profile, entry = await self._previews.run(
                (backend.name, canonical_model(model)), lambda: self._preview_inputs(backend, model),
                max_age_s=backend.settings.vram_refresh_s)
        except (ProbeError, LookupError, VramUnavailable) as exc:
            return LoadPreview.unknown(str(exc) or type(exc).__name__)
        budget = None if entry is None else entry.budget
        if budget is None:
            return LoadPreview.unknown("no vram source" if entry is None else entry.problem or "no GPU reading")
        if any(same_model(m.name, model) for m in budget.residents):
            return RESIDENT
        return preview_of(self._decision(backend, model, profile, budget, at_default=False)[0])

    async def _preview_inputs(self, backend: Backend, model: str) -> tuple[ModelProfile, GpuEntry | None]:
        profile = await self._probes.profile(backend, model)
        return profile, await read_gpu_entry(backend, self._probes, self._reservations, self.shared_gpu)

    def resident(self, backend: str, model: str) -> bool | None:
        """Whether the last /api/ps kvgate read from ``backend`` listed ``model`` (None: none read yet)."""
        listed = self._probes.last_loaded(backend)
        return None if listed is None else any(same_model(name, model) for name in listed)

    def _decision(
        self, backend: Backend, model: str, profile: ModelProfile, budget: GpuBudget, *, at_default: bool,
        cpu: tuple[bool, str] | None = None,
    ) -> tuple[LoadDecision, bool]:
        """The decision with ``budget`` (no I/O), and whether its context was asked for explicitly; with ``cpu``
        (whether the backend offloads, and why kvgate thinks so) a refused load meets ``residency.when_gpu_full``
        (offload.py); without (a preview), it stays refused."""
        settings = backend.settings
        residency = self._settings.residency
        explicit = None if at_default else settings.context_tokens or profile.context_tokens
        asked = explicit or profile.context_tokens or default_context_tokens(budget.total_bytes,
                                                                             profile.shape.n_ctx_train)
        floor = asked if at_default else residency.min_context_tokens

        def load_bytes_at(context: int) -> int:
            if profile.embedding_only:  # Ollama runs an embedding model alone, and it keeps no KV cache
                cost = estimate_load_cost(profile, context_tokens=context, parallel=1)
                return replace(cost, kv_bytes=0).total_bytes
            return estimate_load_cost(
                profile,
                context_tokens=context,
                parallel=self.parallel_for(backend, profile),
                knobs=RunKnobs(type_k=settings.cache_type_k, type_v=settings.cache_type_v),
            ).total_bytes

        own = self._model_settings(model)
        ask = LoadAsk(model, asked, floor, load_bytes_at, own.priority if own else 0)
        own_bytes = sum(m.resident_bytes for m in budget.residents if same_model(m.name, model))
        residents = [self._state(backend, m.name, m.resident_bytes) for m in budget.residents
                     if not same_model(m.name, model)]
        max_loaded = settings.max_loaded_models or GPUS_PER_DEFAULT_SLOT * max(1, budget.devices)
        room = GpuRoom(budget.available_bytes, budget.total_bytes, residency.headroom_bytes, max_loaded)
        now_s = self._clock()
        decision = decide_load(ask, room, residents, now_s=now_s, min_resident_s=residency.min_resident_s,
                               own_resident_bytes=own_bytes)
        if decision.action is LoadAction.REFUSE and cpu is not None:
            full = FullGpu(decision, ask, residents, replace(room, available_bytes=room.available_bytes + own_bytes),
                           now_s=now_s, min_resident_s=residency.min_resident_s)
            decision = when_full(residency.when_gpu_full, full, cpu,
                                 SpillTarget(backend, profile, residency.meminfo_path))
        return decision, explicit is not None

    def _state(self, backend: Backend, name: str, resident_bytes: int) -> ResidentState:
        key = (backend.name, canonical_model(name))
        settings = self._model_settings(name)
        active = max(self._claims.get(key, 0), *(
            self._room.active_sequences(backend.name, spelling)
            for spelling in name_candidates(name)))
        last_used_s = self._last_used.get(key, float("-inf"))
        elsewhere_s = self._loaded_elsewhere.get(key, float("-inf"))
        loaded_at_s = max(self._loaded_at.get(key, float("-inf")), elsewhere_s)
        expected_s = max(self._loaded_at.get(key, float("-inf")), self._expected_at.get(key, float("-inf")))
        now_s = self._clock()
        awaited = ((expected_s > last_used_s and now_s - expected_s < self._settings.residency.load_wait_s)
                   or now_s - elsewhere_s < min(self._settings.shared_ledger.lease_ttl_s,
                                                self._settings.residency.load_wait_s))
        return ResidentState(
            name=name, resident_bytes=resident_bytes, active_sequences=active,
            pinned=bool(settings and settings.pin), priority=settings.priority if settings else 0,
            last_used_s=last_used_s, loaded_at_s=loaded_at_s, awaited=awaited,
        )

    def _model_settings(self, model: str) -> ModelSettings | None:
        name = find_model(model, self._settings.models.keys())
        return None if name is None else self._settings.models[name]

    async def _carry_out(self, backend: Backend, decision: LoadDecision, *, explicit: bool, embedding: bool) -> None:
        for name in decision.unload:
            await self._unload(backend, name)
        if decision.lowered_from is not None or decision.unload or decision.offloaded_ram_bytes:
            log.warning("%s", _describe(backend, decision))
        num_ctx = decision.context_tokens if explicit or decision.lowered_from is not None else None
        reservation = self._reservations.reserve(backend.name, decision.model, decision.load_bytes)
        held = self.lock(backend).held
        try:
            if held is not None:  # every other replica counts its bytes until it ends
                await held.loading(decision.model, decision.load_bytes)
            try:
                await self._probes.load_model(backend, decision.model, num_ctx, embedding=embedding)
            except ProbeError as exc:
                if decision.offloaded_ram_bytes:  # it did not spill as llama.cpp's fit would: fit is off there
                    self.cpu_offload.saw(backend.name, False, f"a load kvgate let run partly on the CPU failed ({exc})")
                    log.warning("%s failed to load model %r partly on the CPU (%s); kvgate no longer offloads there: "
                                "set the backend's cpu_offload = \"off\" if it runs with LLAMA_ARG_FIT=off",
                                backend.describe(), decision.model, exc)
                raise
            self._count(backend).loads += 1
            if held is not None:
                held.loaded(decision.model)
            self._count(backend).lowered += decision.lowered_from is not None
            self._loaded_at[(backend.name, canonical_model(decision.model))] = self._clock()
        finally:
            self._reservations.release(reservation)

    async def _unload(self, backend: Backend, name: str) -> None:
        self.on_change(backend.name, name)
        held = self.lock(backend).held
        if held is not None:  # the other replicas read its pool anew once the lease is given back
            held.unloaded(name)
        await self._probes.unload_model(backend, name)
        self._count(backend).unloads += 1
        self._loaded_at.pop((backend.name, canonical_model(name)), None)
        deadline_s = self._clock() + UNLOAD_WAIT_S
        while any(same_model(m.name, name) for m in await self._probes.loaded_models(backend)):
            if self._clock() >= deadline_s:
                raise ProbeError(f"{_label(backend, name)} is still loaded {UNLOAD_WAIT_S:g} s after kvgate "
                                 "unloaded it (keep_alive 0): it may be serving requests kvgate does not see")
            await self._sleep(LOAD_POLL_S / 5)
        await self._probes.vram(backend, taken_after_s=self._clock())


def lowered_of(loaded: Loaded | None) -> Lowered | None:
    decision = None if loaded is None else loaded.decision
    if loaded is None or decision is None or decision.lowered_from is None:
        return None
    return Lowered(decision.model, decision.lowered_from, decision.context_tokens, decision.describe(),
                   at_default=not loaded.explicit)


def _describe(backend: Backend, decision: LoadDecision) -> str:
    return f"GPU memory on {backend.describe()}: {decision.describe()}"


def _label(backend: Backend, model: str) -> str:
    return f"model {model!r} on {backend.describe()}"
