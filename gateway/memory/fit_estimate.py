"""`kvgate estimate` and GET /kvgate/fit: does a model fit, and what is the most it can be given (pure).

    total = weights + KV pool + compute + output + overhead        (load_cost)
    available = free VRAM + the model's own resident copy (its size_vram when loaded), at most the GPU's total
    headroom = available - total; fits when headroom >= 0
    max_context:  largest multiple of 256 tokens (<= n_ctx_train) that fits at this parallelism
    max_parallel: largest number of sequences (<= 256) that fits at this context
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.memory.kv import (
    CTX_PAD_TOKENS,
    LLAMA_MAX_SEQ,
    CacheType,
    kv_bytes_per_token,
    parse_cache_type,
)
from gateway.memory.load_cost import DEFAULT_KNOBS, LoadCost, RunKnobs, estimate_load_cost
from gateway.memory.profile import ModelProfile

UNBOUNDED_CONTEXT = 1 << 20  # search bound when a model does not report its training context


@dataclass(frozen=True)
class Estimate:
    model: str
    source: str
    quantization: str | None
    context_tokens: int
    parallel: int
    unified: bool
    type_k: CacheType
    type_v: CacheType
    kv_bytes_per_token: int
    cost: LoadCost
    vram_total_bytes: int | None
    vram_free_bytes: int | None
    max_context_tokens: int | None
    max_parallel: int | None
    warnings: tuple[str, ...]
    vram_resident_bytes: int = 0  # the model's own loaded copy, counted in the reading's used memory
    n_layers: int = 0  # the model's blocks (what a partial offload splits); 0 when not known

    @property
    def total_bytes(self) -> int:
        return self.cost.total_bytes

    @property
    def available_bytes(self) -> int | None:
        """What this load may take: free VRAM plus the model's own resident copy (a reload replaces it)."""
        return available_bytes(self.vram_free_bytes, self.vram_resident_bytes, self.vram_total_bytes)

    @property
    def headroom_bytes(self) -> int | None:
        available = self.available_bytes
        return None if available is None else available - self.cost.total_bytes

    @property
    def fits(self) -> bool | None:
        headroom = self.headroom_bytes
        return None if headroom is None else headroom >= 0

    def to_json(self) -> dict[str, Any]:
        cost = self.cost
        return {
            "model": self.model,
            "source": self.source,
            "quantization": self.quantization,
            "context": self.context_tokens,
            "parallel": self.parallel,
            "unified": self.unified,
            "cache_type_k": self.type_k.value,
            "cache_type_v": self.type_v.value,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_cells": cost.layout.cells_full * cost.layout.n_streams,
            "n_ctx_slot": cost.layout.n_ctx_slot,
            "weights_bytes": cost.weights_bytes,
            "kv_bytes": cost.kv_bytes,
            "compute_bytes": cost.compute_bytes,
            "output_bytes": cost.output_bytes,
            "overhead_bytes": cost.overhead_bytes,
            "total_bytes": cost.total_bytes,
            "vram_total_bytes": self.vram_total_bytes,
            "vram_free_bytes": self.vram_free_bytes,
            "vram_available_bytes": self.available_bytes,
            "headroom_bytes": self.headroom_bytes,
            "fits": self.fits,
            "max_context": self.max_context_tokens,
            "max_parallel": self.max_parallel,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, slots=True)
class VramRoom:
    """The GPU memory a load is weighed against: the device's total, what is free now (None: no reading), and the
    model's own loaded copy (Ollama /api/ps size_vram), which is available to it."""

    total_bytes: int | None = None
    free_bytes: int | None = None
    resident_bytes: int = 0


UNKNOWN_VRAM = VramRoom()


def _cost(profile: ModelProfile, knobs: RunKnobs, context_tokens: int, parallel: int) -> LoadCost:
    return estimate_load_cost(profile, context_tokens=context_tokens, parallel=parallel, knobs=knobs)


def available_bytes(free_bytes: int | None, resident_bytes: int, total_bytes: int | None) -> int | None:
    """Free VRAM plus ``resident_bytes`` already held by the model itself, capped at ``total_bytes`` (a reading
    taken before the load, or a static size, does not count the resident copy as used)."""
    if free_bytes is None:
        return None
    available = free_bytes + resident_bytes
    cap = available_cap_bytes(free_bytes, total_bytes)
    return available if cap is None else min(available, cap)


def available_cap_bytes(free_bytes: int, total_bytes: int | None) -> int | None:
    """The most ``available_bytes`` can be, whatever is resident: the GPU's total (or the free reading, when that is
    larger); None without a total."""
    return None if total_bytes is None else max(total_bytes, free_bytes)


def _largest(lo: int, hi: int, fits: Any) -> int:
    """Largest n in [lo, hi] with fits(n), assuming fits is monotone; lo - 1 when none."""
    if not fits(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _max_context(profile: ModelProfile, knobs: RunKnobs, parallel: int, free_bytes: int) -> int:
    limit = profile.shape.n_ctx_train or UNBOUNDED_CONTEXT
    steps = _largest(
        1, max(1, limit // CTX_PAD_TOKENS),
        lambda n: _cost(profile, knobs, n * CTX_PAD_TOKENS, parallel).total_bytes <= free_bytes,
    )
    return steps * CTX_PAD_TOKENS


def _max_parallel(profile: ModelProfile, knobs: RunKnobs, context_tokens: int, free_bytes: int) -> int:
    return _largest(1, LLAMA_MAX_SEQ, lambda n: _cost(profile, knobs, context_tokens, n).total_bytes <= free_bytes)


def estimate(
    profile: ModelProfile,
    *,
    context: int,
    parallel: int = 1,
    knobs: RunKnobs = DEFAULT_KNOBS,
    vram: VramRoom = UNKNOWN_VRAM,
) -> Estimate:
    """Breakdown and verdict for ``parallel`` sequences of ``context`` tokens run with ``knobs`` (see load_cost for
    ``unified``), against ``vram``."""
    vram_total_bytes, vram_free_bytes, vram_resident_bytes = vram.total_bytes, vram.free_bytes, vram.resident_bytes
    unified, type_k, type_v = knobs.unified, knobs.type_k, knobs.type_v
    if context <= 0:
        raise ValueError(f"context is {context} tokens; must be > 0")
    if not 1 <= parallel <= LLAMA_MAX_SEQ:
        raise ValueError(f"parallel is {parallel}; allowed: 1..{LLAMA_MAX_SEQ}")
    if vram_free_bytes is not None and vram_free_bytes < 0:
        raise ValueError(f"free VRAM is {vram_free_bytes} bytes; must be >= 0")
    if vram_resident_bytes < 0:
        raise ValueError(f"resident VRAM is {vram_resident_bytes} bytes; must be >= 0")
    cost = _cost(profile, knobs, context, parallel)
    warnings = list(profile.all_warnings)
    n_ctx_train = profile.shape.n_ctx_train
    if n_ctx_train and context > n_ctx_train:
        warnings.append(
            f"context {context} exceeds the model's training context {n_ctx_train}; llama-server caps each "
            f"slot at {n_ctx_train} but still allocates the whole pool"
        )
    max_context = max_parallel = None
    available = available_bytes(vram_free_bytes, vram_resident_bytes, vram_total_bytes)
    if available is not None:
        max_context = _max_context(profile, knobs, parallel, available)
        max_parallel = _max_parallel(profile, knobs, context, available)
    return Estimate(
        model=profile.name,
        source=profile.source.value,
        quantization=profile.quantization,
        context_tokens=context,
        parallel=parallel,
        unified=unified,
        type_k=type_k,
        type_v=type_v,
        kv_bytes_per_token=kv_bytes_per_token(profile.shape, type_k, type_v),
        cost=cost,
        vram_total_bytes=vram_total_bytes,
        vram_free_bytes=vram_free_bytes,
        max_context_tokens=max_context,
        max_parallel=max_parallel,
        warnings=tuple(warnings),
        vram_resident_bytes=vram_resident_bytes,
        n_layers=profile.shape.n_layers,
    )


@dataclass(frozen=True)
class FitParams:
    """Validated query of GET /kvgate/fit (``?model=..&context=..&parallel=..&cache_type_k=..``)."""

    model: str
    context: int | None
    parallel: int | None
    type_k: CacheType
    type_v: CacheType


def _positive_int(query: Mapping[str, str], key: str, upper: int) -> int | None:
    raw = query.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{key} is {raw!r}; expected an integer in 1..{upper}") from None
    if not 1 <= value <= upper:
        raise ValueError(f"{key} is {value}; allowed: 1..{upper}")
    return value


def parse_fit_params(query: Mapping[str, str]) -> FitParams:
    """Validate /kvgate/fit query parameters; ValueError names the parameter, the value and what is allowed."""
    model = query.get("model", "").strip()
    if not model:
        raise ValueError("model is required (a model name, a preset or a GGUF path)")
    return FitParams(
        model=model,
        context=_positive_int(query, "context", UNBOUNDED_CONTEXT),
        parallel=_positive_int(query, "parallel", LLAMA_MAX_SEQ),
        type_k=parse_cache_type(query.get("cache_type_k") or "f16"),
        type_v=parse_cache_type(query.get("cache_type_v") or "f16"),
    )
