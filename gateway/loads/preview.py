"""What loading a model on a backend would take now, without loading it: a preview for routing (pure).

``LoadGate.preview`` (gate.py) asks ``decide_load`` the question a load would ask, with the backend's last GPU
reading and /api/ps (at most ``vram_refresh_s`` old, shared by the requests that ask together), and turns the
answer into a ``LoadPreview`` with ``preview_of``. It takes no lock and no claim, unloads nothing, reserves nothing
and loads nothing: the load itself, if the request goes there, is decided again (``LoadGate.load``).

    RESIDENT   /api/ps shows the model loaded: nothing to load
    FITS       it loads beside what is resident (at the context asked for, or at a lowered one: ``lowered_to``)
    EVICTS     it loads after unloading idle models: ``evict_models`` of them, ``evict_bytes`` in all
    CANNOT     the load would wait or be refused now
    UNKNOWN    no GPU check applies (no ``vram`` source, residency off, not Ollama), or nothing could be read
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.loads.plan import LoadAction, LoadDecision


class PreviewVerdict(StrEnum):
    RESIDENT = "resident"
    FITS = "fits"
    EVICTS = "evicts"
    CANNOT = "cannot"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class LoadPreview:
    verdict: PreviewVerdict
    evict_models: tuple[str, ...] = ()
    evict_bytes: int = 0
    lowered_to: int | None = None
    reason: str = ""

    @staticmethod
    def unknown(reason: str) -> LoadPreview:
        return LoadPreview(PreviewVerdict.UNKNOWN, reason=reason)


RESIDENT = LoadPreview(PreviewVerdict.RESIDENT)


def preview_of(decision: LoadDecision) -> LoadPreview:
    """The preview a load decision amounts to; a load that would spill onto the CPU counts as one that can't load
    now (the GPU can't hold it)."""
    if decision.action is not LoadAction.LOAD or decision.offloaded_ram_bytes:
        return LoadPreview(PreviewVerdict.CANNOT, reason=decision.reason or decision.describe())
    lowered = decision.context_tokens if decision.lowered_from is not None else None
    if decision.unload:
        return LoadPreview(PreviewVerdict.EVICTS, decision.unload, decision.freed_bytes, lowered,
                           decision.describe())
    return LoadPreview(PreviewVerdict.FITS, lowered_to=lowered, reason=decision.describe())
