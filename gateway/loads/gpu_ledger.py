"""The GPU ledger: where the bytes of one backend's GPU(s) go, and whether a model load fits.

Theory of operation
-------------------
The load level of the budget (design.md section 2), in bytes. One live VRAM reading (NVML, an exporter, the
simulator's GPU, a static size), the models the backend has resident, and the loads kvgate has let start but the
reading may not show yet, make one ``GpuBudget``:

    total_bytes  | model A | model B | other processes | reserved (loads in flight) | free |
                 '---- resident ----'

- A resident model's bytes are what the backend reports (Ollama /api/ps ``size_vram``: "reported"), else kvgate's
  own estimate of weights + KV pool + compute buffers (``load_cost``: "estimated").
- ``other_processes_bytes = max(0, used - resident)``: what the device uses beyond the models (foreign processes, a
  second server, CUDA contexts). An estimate larger than the reading counts as resident, never as negative other.
- ``free_bytes = max(0, total - resident - other - reserved)``; ``overcommitted`` when resident + other + reserved
  exceed total (a foreign process took memory behind the server's back, or reservations outran the GPU).

``fits_load`` answers the question a load admission asks: does ``load_bytes`` fit now, beside ``headroom_bytes`` kept
free, or after unloading some idle models (in the order given), or not at all, with the numbers. It is ``plan_load``
over the budget; ``plan_load`` (available bytes, ordered (name, bytes) candidates, an optional cap) is the one fit
decision, also behind /kvgate/fit and `kvgate estimate` (``gateway.loads.standing.plan_unload``). ``LoadReservations``
records loads in flight per backend; each is released exactly once, like ``ledger.Reservation``.

Pure: no I/O, no clock, no logging; the app reads the sources and keeps the last budget per backend in a
``GpuBoard`` for the status page and the metrics.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gateway.memory.load_cost import LoadCost
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.memory.vram import DeviceMemory, VramReading


class SizeSource(StrEnum):
    REPORTED = "reported"  # the backend said so (Ollama /api/ps size_vram)
    ESTIMATED = "estimated"  # kvgate's load_cost estimate


@dataclass(frozen=True, slots=True)
class ResidentModel:
    """One model holding GPU memory; the parts are known only for an estimate."""

    name: str
    resident_bytes: int
    source: SizeSource
    weights_bytes: int | None = None
    kv_bytes: int | None = None
    compute_bytes: int | None = None


def reported_resident(loaded: LoadedModel) -> ResidentModel:
    """An Ollama /api/ps entry: its ``size_vram`` is on the GPU (``size`` - ``size_vram`` is in system memory)."""
    return ResidentModel(loaded.name, max(0, loaded.size_vram_bytes), SizeSource.REPORTED)


def estimated_resident(name: str, cost: LoadCost) -> ResidentModel:
    """kvgate's estimate of a load: weights + KV pool + compute (+ output buffer and configured overhead)."""
    return ResidentModel(name, cost.total_bytes, SizeSource.ESTIMATED, weights_bytes=cost.weights_bytes,
                         kv_bytes=cost.kv_bytes, compute_bytes=cost.compute_bytes)


@dataclass(frozen=True, slots=True)
class GpuBudget:
    """The bytes of one backend's GPU(s), summed over the devices of the reading; see the module docstring."""

    backend: str
    source: str
    devices: int
    total_bytes: int
    used_bytes: int
    residents: tuple[ResidentModel, ...]
    other_processes_bytes: int
    reserved_bytes: int
    per_device: tuple[DeviceMemory, ...] = ()
    """Each device's own reading (name, total, used, free), for the status page; the budget itself is the sum."""

    @property
    def resident_bytes(self) -> int:
        return sum(model.resident_bytes for model in self.residents)

    @property
    def committed_bytes(self) -> int:
        return self.resident_bytes + self.other_processes_bytes + self.reserved_bytes

    @property
    def available_bytes(self) -> int:
        """total - resident - other - reserved; negative when overcommitted."""
        return self.total_bytes - self.committed_bytes

    @property
    def free_bytes(self) -> int:
        return max(0, self.available_bytes)

    @property
    def overcommitted(self) -> bool:
        return self.committed_bytes > self.total_bytes


def build_budget(
    backend: str, reading: VramReading, residents: Sequence[ResidentModel], reserved_bytes: int = 0
) -> GpuBudget:
    if reserved_bytes < 0:
        raise ValueError(f"reserved is {reserved_bytes} bytes; must be >= 0")
    resident_bytes = sum(model.resident_bytes for model in residents)
    return GpuBudget(
        backend=backend, source=reading.source, devices=len(reading.devices), total_bytes=reading.total_bytes,
        used_bytes=reading.used_bytes, residents=tuple(residents),
        other_processes_bytes=max(0, reading.used_bytes - resident_bytes), reserved_bytes=reserved_bytes,
        per_device=reading.devices,
    )


class FitVerdict(StrEnum):
    FITS = "fits"
    FITS_AFTER_UNLOADING = "fits_after_unloading"
    DOES_NOT_FIT = "does_not_fit"


@dataclass(frozen=True, slots=True)
class LoadFit:
    """``unload``: the idle models to unload first (empty unless FITS_AFTER_UNLOADING), freeing ``freed_bytes``;
    ``short_by_bytes``: what is missing even after unloading every idle model (0 unless DOES_NOT_FIT)."""

    verdict: FitVerdict
    load_bytes: int
    headroom_bytes: int
    available_bytes: int
    unload: tuple[str, ...] = ()
    freed_bytes: int = 0
    short_by_bytes: int = 0


def plan_load(
    available_bytes: int, load_bytes: int, candidates: Sequence[tuple[str, int]], headroom_bytes: int = 0,
    cap_bytes: int | None = None,
) -> LoadFit:
    """The one fit decision: whether ``load_bytes`` fits in ``available_bytes`` with ``headroom_bytes`` left free,
    now or after unloading a prefix of ``candidates`` ((name, bytes) in the order to unload them, taken as given),
    or not at all. The room after freeing ``freed`` bytes is ``min(available + freed, cap_bytes) - headroom``
    (no cap when ``cap_bytes`` is None), so unloading never makes more room than the cap."""
    if load_bytes < 0 or headroom_bytes < 0:
        raise ValueError(f"load is {load_bytes} bytes and headroom {headroom_bytes}; neither can be negative")

    def room(freed: int) -> int:
        total = available_bytes + freed
        return (total if cap_bytes is None else min(total, cap_bytes)) - headroom_bytes

    available = room(0)
    if load_bytes <= available:
        return LoadFit(FitVerdict.FITS, load_bytes, headroom_bytes, available)
    unload: list[str] = []
    freed = 0
    for name, size in candidates:
        unload.append(name)
        freed += size
        if load_bytes <= room(freed):
            return LoadFit(FitVerdict.FITS_AFTER_UNLOADING, load_bytes, headroom_bytes, available, tuple(unload),
                           freed)
    return LoadFit(FitVerdict.DOES_NOT_FIT, load_bytes, headroom_bytes, available,
                   short_by_bytes=load_bytes - room(freed))


def fits_load(
    budget: GpuBudget, load_bytes: int, headroom_bytes: int, idle_models: Sequence[str] = ()
) -> LoadFit:
    """Whether a load of ``load_bytes`` fits with ``headroom_bytes`` left free: now, after unloading a prefix of
    ``idle_models`` (names of resident models, in the order to unload them; others and repeats are ignored), or not
    at all: ``plan_load`` with the budget's numbers."""
    sizes = {model.name: model.resident_bytes for model in budget.residents}
    candidates = [(name, sizes[name]) for name in dict.fromkeys(idle_models) if name in sizes]
    return plan_load(budget.available_bytes, load_bytes, candidates, headroom_bytes)


@dataclass(frozen=True, slots=True)
class LoadReservation:
    id: int
    backend: str
    model: str
    load_bytes: int


class LoadReservations:
    """Bytes held for loads in flight, per backend, until the backend's own reading shows them; single-threaded."""

    def __init__(self) -> None:
        self._live: dict[int, LoadReservation] = {}
        self._ids = itertools.count(1)

    def reserve(self, backend: str, model: str, load_bytes: int) -> LoadReservation:
        if load_bytes < 0:
            raise ValueError(f"a load reservation of {load_bytes} bytes; must be >= 0")
        reservation = LoadReservation(next(self._ids), backend, model, load_bytes)
        self._live[reservation.id] = reservation
        return reservation

    def release(self, reservation: LoadReservation) -> bool:
        """Free it; True the first time, False (and nothing changes) on every later call or for a stranger."""
        if self._live.get(reservation.id) is not reservation:
            return False
        del self._live[reservation.id]
        return True

    def reserved_bytes(self, backend: str) -> int:
        return sum(r.load_bytes for r in self._live.values() if r.backend == backend)

    def reservations(self, backend: str) -> tuple[LoadReservation, ...]:
        return tuple(r for r in self._live.values() if r.backend == backend)


@dataclass(frozen=True, slots=True)
class GpuEntry:
    """The last thing learned about one backend's GPU: a budget, and why it is missing or partial."""

    budget: GpuBudget | None
    problem: str | None = None


class GpuBoard:
    """The last ``GpuEntry`` per backend: written when the app refreshes, read by the status page and the metrics
    (a scrape does no I/O)."""

    def __init__(self) -> None:
        self._entries: dict[str, GpuEntry] = {}

    def put(self, backend: str, entry: GpuEntry) -> None:
        self._entries[backend] = entry

    def entries(self) -> dict[str, GpuEntry]:
        return dict(self._entries)
