"""Load cost of a model: weights + KV pool + compute buffers + output buffer + configured overhead.

KV bytes are exact (``kv``). Compute buffers have no closed form in llama.cpp; ``estimate_compute_bytes`` is a
fit to llama-server's ``sched_reserve: ... compute buffer size`` on CPU (tiny models, n_ubatch 512): never more
than 3% below the logged value, and at most a few MiB above it (more without flash attention):

    activations = 4 * n_ubatch * (4 * n_ff + 3 * n_embd)
    attention   = flash attn: 2 * n_ubatch * (cells + swa_cells)                        (f16 KQ mask)
                  otherwise:  4 * n_ubatch * (n_head * max(cells, swa_cells) + cells + swa_cells)   (f32 KQ)
    logits      = 4 * n_parallel * n_vocab            (one output row per sequence)
    compute     = activations + max(attention, logits)

GPU backends add their own pools and a CUDA context (a few hundred MiB): that is what ``overhead_bytes`` is for.
After a real load, ``calibrate_from_log`` / ``calibrate_from_ps`` replace guesses with what the backend reported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.memory.kv import CacheType, KvLayout, ServerFlags, kv_cache_bytes, llama_server_layout
from gateway.memory.llama_log import LoggedBuffers
from gateway.memory.profile import ModelProfile

DEFAULT_N_VOCAB = 128_256  # used when a source does not report the vocabulary size
F32_BYTES = 4


@dataclass(frozen=True)
class LoadCost:
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    layout: KvLayout

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes + self.overhead_bytes

    @property
    def buffers_bytes(self) -> int:
        """What the backend itself reports (Ollama /api/ps size): everything but the configured overhead."""
        return self.total_bytes - self.overhead_bytes


@dataclass(frozen=True)
class Calibration:
    """Corrections learned from a real load of one model; apply to later estimates of the same model."""

    weights_bytes: int | None = None
    compute_scale: float = 1.0
    gpu_fraction: float = 1.0  # share of the load in device memory (Ollama size_vram / size)
    source: str = ""


def estimate_compute_bytes(
    profile: ModelProfile, layout: KvLayout, *, n_ubatch: int = 512, flash_attn: bool = True
) -> int:
    shape = profile.shape
    ubatch = max(1, min(n_ubatch, layout.cells_full))
    n_ff = profile.n_ff or 4 * shape.n_embd
    activations = F32_BYTES * ubatch * (4 * n_ff + 3 * shape.n_embd)
    cells, swa_cells = layout.cells_full, layout.cells_swa
    if flash_attn:
        attention = 2 * ubatch * (cells + swa_cells)
    else:
        n_head = max(shape.n_head, default=0)
        attention = F32_BYTES * ubatch * (n_head * max(cells, swa_cells) + cells + swa_cells)
    logits = F32_BYTES * layout.n_parallel * (profile.n_vocab or DEFAULT_N_VOCAB)
    return activations + max(attention, logits)


def output_buffer_bytes(profile: ModelProfile, n_parallel: int) -> int:
    return F32_BYTES * n_parallel * (profile.n_vocab or DEFAULT_N_VOCAB)


@dataclass(frozen=True, slots=True)
class RunKnobs:
    """How the server runs a model, beyond its context and parallel sequences: the KV cache's types, one unified
    pool or a slot each, a fixed overhead, the micro-batch, flash attention, and a calibration from its own log."""

    type_k: CacheType = CacheType.F16
    type_v: CacheType = CacheType.F16
    unified: bool = False
    overhead_bytes: int = 0
    n_ubatch: int = 512
    flash_attn: bool = True
    calibration: Calibration | None = None


DEFAULT_KNOBS = RunKnobs()


def estimate_load_cost(
    profile: ModelProfile, *, context_tokens: int, parallel: int, knobs: RunKnobs = DEFAULT_KNOBS,
) -> LoadCost:
    """Cost of loading ``profile`` for ``parallel`` sequences of ``context_tokens`` each.

    Split (the default, and what Ollama does): ``-c context*parallel -np parallel``. Unified: one pool of
    ``context_tokens`` shared by ``parallel`` slots (llama-server without -np, or with -kvu).
    """
    type_k, type_v, unified, n_ubatch, flash_attn = (
        knobs.type_k,
        knobs.type_v,
        knobs.unified,
        knobs.n_ubatch,
        knobs.flash_attn,
    )
    overhead_bytes, calibration = knobs.overhead_bytes, knobs.calibration
    if overhead_bytes < 0:
        raise ValueError(f"overhead is {overhead_bytes} bytes; must be >= 0")
    ctx_size = context_tokens if unified else context_tokens * parallel
    if context_tokens <= 0:
        raise ValueError(f"context is {context_tokens} tokens; must be > 0")
    layout = llama_server_layout(
        profile.shape, ServerFlags(ctx_size=ctx_size, n_parallel=parallel, unified=unified, n_ubatch=n_ubatch)
    )
    cost = LoadCost(
        weights_bytes=profile.weights_bytes,
        kv_bytes=kv_cache_bytes(profile.shape, layout, type_k, type_v, flash_attn=flash_attn),
        compute_bytes=estimate_compute_bytes(profile, layout, n_ubatch=n_ubatch, flash_attn=flash_attn),
        output_bytes=output_buffer_bytes(profile, parallel),
        overhead_bytes=overhead_bytes,
        layout=layout,
    )
    return apply_calibration(cost, calibration) if calibration else cost


def apply_calibration(cost: LoadCost, calibration: Calibration) -> LoadCost:
    return replace(
        cost,
        weights_bytes=calibration.weights_bytes if calibration.weights_bytes is not None else cost.weights_bytes,
        compute_bytes=round(cost.compute_bytes * calibration.compute_scale),
    )


def calibrate_from_log(cost: LoadCost, buffers: LoggedBuffers) -> Calibration:
    """From llama-server's logged buffers for the load that ``cost`` predicted (same context and parallel)."""
    scale = buffers.compute_bytes / cost.compute_bytes if cost.compute_bytes and buffers.compute_bytes else 1.0
    total = buffers.total_bytes
    return Calibration(
        weights_bytes=buffers.model_bytes or None,
        compute_scale=scale,
        gpu_fraction=buffers.gpu_bytes / total if total and buffers.gpu_bytes else 1.0,
        source="llama-server log",
    )


def calibrate_from_ps(cost: LoadCost, *, size_bytes: int, size_vram_bytes: int) -> Calibration:
    """From Ollama /api/ps: ``size`` is the sum of the backend's buffers; what KV, weights and output do not
    explain is compute."""
    known = cost.weights_bytes + cost.kv_bytes + cost.output_bytes
    observed_compute = max(0, size_bytes - known)
    scale = observed_compute / cost.compute_bytes if cost.compute_bytes else 1.0
    fraction = size_vram_bytes / size_bytes if size_bytes > 0 else 1.0
    return Calibration(compute_scale=scale, gpu_fraction=min(1.0, fraction), source="ollama /api/ps")
