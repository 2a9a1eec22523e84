"""The GPU ledger, live: read each backend's VRAM source and resident models, build its budget, render it.

``refresh_gpus`` reads every backend that has a ``vram`` source (cached readings, ``vram_refresh_s``) and its
resident models, and keeps the budgets in a ``GpuBoard``; it never raises, a backend it cannot read gets its reason.
What a budget holds and how it is read: ``gateway.loads.gpu_reading``.
``gpu_rows`` renders the board for ``/kvgate/status``; the metrics read the same board.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from gateway.backends import BackendRegistry
from gateway.backends.probes import BackendProbes
from gateway.loads.gate import LoadCounts
from gateway.loads.gpu_ledger import GpuBoard, GpuBudget, GpuEntry, LoadReservations
from gateway.loads.gpu_reading import read_gpu_entry
from gateway.loads.shared_gpu import SharedGpu
from gateway.support.safe_text import safe_text


async def refresh_gpus(
    registry: BackendRegistry, probes: BackendProbes, reservations: LoadReservations, board: GpuBoard,
    shared: SharedGpu | None = None,
) -> None:
    backends = registry.backends
    entries = await asyncio.gather(*(read_gpu_entry(b, probes, reservations, shared) for b in backends))
    for backend, entry in zip(backends, entries, strict=True):
        if entry is not None:
            board.put(backend.name, entry)


def gpu_rows(board: GpuBoard, loads: Mapping[str, LoadCounts] | None = None) -> list[dict[str, Any]]:
    """One JSON row per backend with a VRAM source, with what load admission did there; every name is safe text."""
    rows = []
    for name, entry in sorted(board.entries().items()):
        row = _row(name, entry)
        counts = (loads or {}).get(name)
        if counts is not None:
            row["loads"] = dataclasses.asdict(counts)
        rows.append(row)
    return rows


def _row(backend: str, entry: GpuEntry) -> dict[str, Any]:
    row: dict[str, Any] = {"backend": safe_text(backend), "problem": entry.problem and safe_text(entry.problem)}
    budget = entry.budget
    if budget is not None:
        row.update(_budget_json(budget))
    return row


def _budget_json(budget: GpuBudget) -> dict[str, Any]:
    return {
        "source": safe_text(budget.source), "devices": budget.devices, "total_bytes": budget.total_bytes,
        "used_bytes": budget.used_bytes,
        "models": [{"name": safe_text(m.name), "resident_bytes": m.resident_bytes, "source": str(m.source),
                    "weights_bytes": m.weights_bytes, "kv_bytes": m.kv_bytes, "compute_bytes": m.compute_bytes}
                   for m in budget.residents],
        "resident_bytes": budget.resident_bytes, "other_processes_bytes": budget.other_processes_bytes,
        "reserved_bytes": budget.reserved_bytes, "free_bytes": budget.free_bytes,
        "overcommitted": budget.overcommitted,
        "per_device": [{"index": d.index, "name": safe_text(d.name), "total_bytes": d.total_bytes,
                        "used_bytes": d.used_bytes, "free_bytes": d.free_bytes} for d in budget.per_device],
    }
