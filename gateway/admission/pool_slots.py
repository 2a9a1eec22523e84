"""How many slots each KV pool is planned with, and where that number came from (for the log and /kvgate/status).

    configured  ``parallel`` in [[backends]] (``KVGATE_BACKEND__PARALLEL`` for the first backend): always wins; an
                Ollama model whose /api/ps size says otherwise is reported (log and status), and the configured
                number kept
    inferred    Ollama, ``parallel`` unset: read from the model's /api/ps entry and its profile each time its pool is
                probed, after every load and reload (gateway.memory.ollama_slots)
    reported    llama-server: /props ``total_slots``
    assumed     nothing could tell (no /api/ps entry, no profile, a size that leaves no room for one sequence): one
                slot, with why, and how to set it

OLLAMA_NUM_PARALLEL is one setting per server: the count last inferred from a model that runs with it (not an
embedding model, not an architecture Ollama runs alone) is the backend's ``parallel_guess`` for a model not loaded
yet (what a load will cost, how many slots a routing estimate counts on).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from gateway.backends import Backend
from gateway.backends.prober import ProbeError, ProfileUnderivable
from gateway.backends.probes import BackendProbes
from gateway.memory.ollama_slots import ONE_SEQUENCE_ARCHITECTURES, SlotInference, infer_ollama_slots
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.ollama_answers import LoadedModel

log = logging.getLogger("gateway.admission.kv_pools")

PoolId = tuple[str, str]
SET_IT = "set parallel = N in [[backends]] (KVGATE_BACKEND__PARALLEL for the first backend) to the server's own"


@dataclass(frozen=True, slots=True)
class SlotSource:
    slots: int
    source: str
    """configured, inferred, reported or assumed (module docstring)."""
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"slots": self.slots, "source": self.source, "detail": self.detail}


class SlotBook:
    """The slot sources of every pool probed so far, and each Ollama backend's parallel as last inferred."""

    def __init__(self) -> None:
        self.sources: dict[PoolId, SlotSource] = {}
        self.disagreements: dict[PoolId, str] = {}
        """Configured ``parallel`` values an Ollama model's /api/ps size disagrees with (for the status page)."""
        self._backend_parallel: dict[str, int] = {}

    def settle(self, backend: Backend, model: str, inferred: SlotInference | None, why_none: str = "") -> SlotSource:
        """The slots an Ollama pool is planned with: configured, else ``inferred`` (None: ``why_none`` says why
        nothing was read); logged when it changes."""
        configured = backend.settings.parallel
        key = (backend.name, model)
        if inferred is not None and inferred.inferred and inferred.reflects_server:
            self._backend_parallel[backend.name] = inferred.slots
        if configured is not None:
            self._check(backend, model, configured, inferred)
            return self.record(key, SlotSource(configured, "configured", f"parallel = {configured} in [[backends]]"),
                               _label(backend, model))
        if inferred is None:
            inferred = SlotInference(1, False, f"assumed 1: {why_none or 'the model has no /api/ps entry'}")
        return self.record(key, SlotSource(inferred.slots, inferred.source, inferred.reason), _label(backend, model),
                           hint=True)

    def record(self, key: PoolId, source: SlotSource, label: str, *, hint: bool = False) -> SlotSource:
        """Keep ``source`` as the pool's; logged once per change (with how to set it, when ``hint``)."""
        if self.sources.get(key) != source:
            advice = f"; {SET_IT} OLLAMA_NUM_PARALLEL to fix it" if hint else ""
            log.log(logging.WARNING if source.source == "assumed" else logging.INFO, "%s: %d slot%s, %s%s", label,
                    source.slots, "" if source.slots == 1 else "s", source.detail, advice)
        self.sources[key] = source
        return source

    def reported(self, backend: Backend, total_slots: int | None) -> int:
        """A llama-server's slots (/props ``total_slots``), or an OpenAI-compatible server's configured ones."""
        configured = backend.settings.parallel
        if total_slots:
            source = SlotSource(total_slots, "reported", "/props total_slots")
        elif configured is not None:
            source = SlotSource(configured, "configured", f"parallel = {configured} in [[backends]]")
        else:
            source = SlotSource(1, "assumed", "assumed 1: /props gives no total_slots")
        return self.record((backend.name, ""), source, backend.describe()).slots

    def _check(self, backend: Backend, model: str, configured: int, inferred: SlotInference | None) -> None:
        key = (backend.name, model)
        if inferred is None or not inferred.inferred or not inferred.reflects_server \
                or inferred.slots == configured:
            self.disagreements.pop(key, None)
            return
        message = (f"{backend.describe()} has parallel = {configured} but model {model!r} runs "
                   f"{inferred.slots} sequence(s) at once by its /api/ps size ({inferred.reason}); kvgate follows "
                   "the configured parallel (set it to the server's OLLAMA_NUM_PARALLEL)")
        if self.disagreements.get(key) != message:
            log.warning("%s", message)
        self.disagreements[key] = message

    def parallel_guess(self, backend: Backend, profile: ModelProfile | None = None) -> int:
        """The sequences a model not loaded yet will run with on ``backend``: configured; one for embedding models
        and the architectures Ollama runs alone; else what the backend's models were last inferred with; else 1."""
        if backend.settings.parallel is not None:
            return backend.settings.parallel
        if profile is not None and ((profile.capabilities and "completion" not in profile.capabilities)
                                    or profile.shape.architecture in ONE_SEQUENCE_ARCHITECTURES):
            return 1
        return self._backend_parallel.get(backend.name, 1)

    def learned_parallel(self, backend: str) -> int | None:
        """What the backend's models were last inferred with (None: nothing inferred there yet)."""
        return self._backend_parallel.get(backend)


async def read_slots(book: SlotBook, probes: BackendProbes, backend: Backend, model: str,
                     entry: LoadedModel | None) -> int:
    """An Ollama model's slots: configured, else read from its /api/ps ``entry`` (re-read after every load and
    reload) and its profile; a configured count the size disagrees with is reported."""
    if entry is None:
        return book.settle(backend, model, None, "the model has no /api/ps entry to read it from").slots
    version = asyncio.ensure_future(probes.ollama_version(backend))  # read beside the profile: one round trip
    try:
        try:
            profile = await probes.profile(backend, model)
        except (ProfileUnderivable, LookupError) as exc:
            return book.settle(backend, model, None, f"its profile can't be derived ({exc})").slots
        except ProbeError as exc:  # /api/show can't be asked right now: a count read before stands
            before = book.sources.get((backend.name, model))
            if before is not None and backend.settings.parallel is None:
                return before.slots
            return book.settle(backend, model, None, f"its profile can't be read now ({exc})").slots
        settings = backend.settings
        inferred = infer_ollama_slots(profile, entry, type_k=settings.cache_type_k, type_v=settings.cache_type_v,
                                      version=await version)
        return book.settle(backend, model, inferred).slots
    finally:  # however this ends (the caller cancelled too), the read beside it ends with it, connection closed
        version.cancel()
        await asyncio.gather(version, return_exceptions=True)


def _label(backend: Backend, model: str) -> str:
    return f"model {model!r} on {backend.describe()}" if model else backend.describe()
