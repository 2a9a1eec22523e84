"""One backend's GPU budget, read live: its VRAM source, its resident models, the loads kvgate has in flight.

Ollama reports its resident models (/api/ps ``size_vram``: "reported"). A llama-server has its one served model
resident; its bytes are kvgate's own estimate ("estimated": weights + KV pool + compute buffers, ``load_cost``) from
the model's profile and the slot layout of /props. A model whose size kvgate cannot derive is left out, its bytes
count as other processes, and the entry says why. Used by the status page and metrics (observability/gpus.py) and by
load admission (gate.py).
"""

from __future__ import annotations

import logging
from pathlib import PurePath

from gateway.backends import Backend
from gateway.backends.prober import ProbeError
from gateway.backends.probes import BackendProbes
from gateway.loads.gpu_ledger import (
    GpuEntry,
    LoadReservations,
    ResidentModel,
    build_budget,
    estimated_resident,
    reported_resident,
)
from gateway.loads.shared_gpu import GpuLedgerUnreachable, SharedGpu
from gateway.memory.load_cost import RunKnobs, estimate_load_cost
from gateway.memory.vram import VramUnavailable

log = logging.getLogger(__name__)


async def read_gpu_entry(
    backend: Backend, probes: BackendProbes, reservations: LoadReservations, shared: SharedGpu | None = None,
) -> GpuEntry | None:
    """None for a backend with no ``vram`` source. ``shared``: a load another replica has in flight on the backend
    counts as reserved too (shared_gpu.py)."""
    try:
        reading = await probes.vram(backend)
    except VramUnavailable as exc:
        log.warning("GPU ledger: no VRAM reading for %s: %s", backend.describe(), exc)
        return GpuEntry(None, f"no VRAM reading: {exc}")
    if reading is None:
        return None
    residents: list[ResidentModel] = []
    problem = None
    if backend.runtime.lists_loaded_models:
        try:
            residents = [reported_resident(loaded) for loaded in await probes.loaded_models(backend)]
        except ProbeError as exc:
            problem = f"resident models unknown (/api/ps: {exc}); their bytes count as other processes"
    elif backend.runtime.serves_one_model:  # what it holds is its one model, sized from /props
        resident, problem = await _llama_server_resident(backend, probes)
        residents = [] if resident is None else [resident]
    reserved_bytes = reservations.reserved_bytes(backend.name)
    if shared is not None:
        try:
            elsewhere = await shared.in_flight(backend.name)
        except GpuLedgerUnreachable as exc:
            elsewhere = None
            problem = "; ".join(filter(None, (problem, f"loads in flight on other replicas unknown (Redis: {exc})")))
        if elsewhere is not None:
            reserved_bytes += elsewhere.load_bytes
    return GpuEntry(build_budget(backend.name, reading, residents, reserved_bytes), problem)


async def _llama_server_resident(
    backend: Backend, probes: BackendProbes
) -> tuple[ResidentModel | None, str | None]:
    """The served model with kvgate's estimate of its load (weights + KV pool of /props' slots + compute), or why
    its size is unknown. The pool layout follows the pool directory: split only when ``unified_kv`` is false."""
    settings = backend.settings
    name = backend.name
    try:
        props = await probes.llama_props(backend)
        alias = props.model_alias if props.model_alias != props.model_path else ""  # the default alias is the path
        name = alias or PurePath(props.model_path).name or backend.name
        profile = await probes.profile(backend, alias or props.model_path)
        cost = estimate_load_cost(
            profile,
            context_tokens=profile.context_tokens or props.n_ctx_slot,
            parallel=profile.parallel or props.total_slots or settings.parallel or 1,
            knobs=RunKnobs(
                type_k=settings.cache_type_k, type_v=settings.cache_type_v, unified=settings.unified_kv is not False
            ),
        )
    except (ProbeError, LookupError, ValueError) as exc:
        log.debug("GPU ledger: size of the model on %s unknown: %s", backend.describe(), exc)
        return None, f"model size unknown: {name}: {exc}; its bytes count as other processes"
    return estimated_resident(name, cost), None
