"""Where a model stands among the models its Ollama backend has loaded (/api/ps), for /kvgate/fit and
`kvgate estimate` (pure).

    resident model   its own ``size_vram`` is its own, not used memory: available = free + size_vram, at most the
                     GPU's total (``estimate.available_bytes``); asked without a context, the fit is for the
                     context it is loaded with
    any model        fits now when total <= available; otherwise the other loaded models are unloaded one by one,
                     soonest to expire first (/api/ps lists the longest-lived first; Ollama evicts idle runners
                     with the shortest session first), until it fits: ``needs_unload`` and ``would_unload``.
                     When even unloading all of them leaves too little, ``needs_unload`` is false and
                     ``fits_after_unload`` says so.

/api/ps does not say which runners are busy; a model serving requests is unloaded only once they finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.backends.model_names import same_model
from gateway.loads.gpu_ledger import FitVerdict, plan_load
from gateway.memory.fit_estimate import Estimate, available_cap_bytes
from gateway.memory.kv import CacheType
from gateway.memory.load_cost import Calibration, RunKnobs, calibrate_from_ps, estimate_load_cost
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.ollama_answers import LoadedModel


@dataclass(frozen=True)
class Residency:
    """The model's own /api/ps entry (None when not loaded) and every other loaded model, in /api/ps order."""

    own: LoadedModel | None
    others: tuple[LoadedModel, ...]

    @property
    def resident_bytes(self) -> int:
        return self.own.size_vram_bytes if self.own else 0


@dataclass(frozen=True)
class UnloadPlan:
    fits_now: bool
    fits_after_unload: bool
    would_unload: tuple[LoadedModel, ...]  # empty unless unloading these (and only these) makes it fit

    @property
    def needs_unload(self) -> bool:
        return bool(self.would_unload)


def residency(model: str, loaded: Sequence[LoadedModel]) -> Residency:
    own = next((entry for entry in loaded if same_model(entry.name, model)), None)
    return Residency(own=own, others=tuple(entry for entry in loaded if entry is not own))


def plan_unload(resident: Residency, result: Estimate) -> UnloadPlan | None:
    """Whether ``result`` fits now, or after unloading which other models; None without a VRAM reading.
    ``gpu_ledger.plan_load`` decides: the others soonest to expire first, the room capped like ``available_bytes``."""
    free = result.vram_free_bytes
    if free is None:
        return None
    order = tuple(reversed(resident.others))
    fit = plan_load(free + result.vram_resident_bytes, result.total_bytes,
                    [(other.name, other.size_vram_bytes) for other in order],
                    cap_bytes=available_cap_bytes(free, result.vram_total_bytes))
    if fit.verdict is FitVerdict.FITS:
        return UnloadPlan(fits_now=True, fits_after_unload=True, would_unload=())
    if fit.verdict is FitVerdict.FITS_AFTER_UNLOADING:
        return UnloadPlan(fits_now=False, fits_after_unload=True, would_unload=order[:len(fit.unload)])
    return UnloadPlan(fits_now=False, fits_after_unload=False, would_unload=())


def calibration_for(
    profile: ModelProfile, loaded: LoadedModel | None, *, parallel: int, type_k: CacheType, type_v: CacheType
) -> Calibration | None:
    """For a model Ollama has loaded: scale the estimate to what /api/ps says the load really took."""
    if loaded is None or not loaded.context_tokens or loaded.size_bytes <= 0:
        return None
    cost = estimate_load_cost(
        profile, context_tokens=loaded.context_tokens, parallel=parallel, knobs=RunKnobs(type_k=type_k, type_v=type_v)
    )
    return calibrate_from_ps(cost, size_bytes=loaded.size_bytes, size_vram_bytes=loaded.size_vram_bytes)


def residency_json(resident: Residency | None, plan: UnloadPlan | None) -> dict[str, Any]:
    """The /kvgate/fit and `kvgate estimate --json` fields; null where the backend does not say (not Ollama, /api/ps
    unreadable) or, for the unload fields, where there is no VRAM reading."""
    own = resident.own if resident else None
    return {
        "resident": None if resident is None else own is not None,
        "resident_bytes": None if resident is None else resident.resident_bytes,
        "resident_context": own.context_tokens if own else None,
        "needs_unload": plan.needs_unload if plan else None,
        "fits_after_unload": plan.fits_after_unload if plan else None,
        "would_unload": [{"model": m.name, "size_vram_bytes": m.size_vram_bytes}
                         for m in (plan.would_unload if plan else ())],
    }


def residency_warnings(resident: Residency | None, plan: UnloadPlan | None) -> list[str]:
    if resident is None or plan is None or plan.fits_after_unload or not resident.others:
        return []
    names = ", ".join(m.name for m in resident.others)
    freed = sum(m.size_vram_bytes for m in resident.others)
    return [f"does not fit even after unloading every other loaded model ({names}: {freed} bytes)"]


def residency_lines(resident: Residency | None, plan: UnloadPlan | None) -> list[str]:
    """For the `kvgate estimate` table."""
    if resident is None:
        return []
    own = resident.own
    lines = [f"  resident: {'yes' if own else 'no'}"
             + (f" ({own.size_vram_bytes} bytes of VRAM, context {own.context_tokens}); its own memory counts as "
                "available" if own else "")]
    if plan is not None and not plan.fits_now:
        if plan.needs_unload:
            lines.append("  fits after unloading: " + ", ".join(m.name for m in plan.would_unload))
        else:
            lines.append("  does not fit even after unloading the other loaded models")
    return lines
