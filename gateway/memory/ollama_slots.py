"""How many sequences Ollama runs a loaded model with (OLLAMA_NUM_PARALLEL), read from its /api/ps size (pure).

Ollama reports neither OLLAMA_NUM_PARALLEL nor the KV cache type over HTTP, but since v0.30 (one llama-server per
model) /api/ps ``size`` is the sum of the buffers the load allocated (ollama.md 3.1 and 4.1)::

    size = weights + KV(num_ctx x N) + compute buffers              N = the sequences the model runs at once

So each count N = 1 .. MAX_SLOTS gives a span of sizes it can explain::

    weights   every tensor (/api/show), less the token embedding table when every layer is on the GPU (llama.cpp
              keeps it in host memory, and /api/ps then counts only GPU buffers), plus a GPU copy of it when the
              output layer is tied to it; when the tensor list does not say which, anything in between
    KV(N)     exact (gateway.memory.kv: sliding windows, recurrent state), at the loaded context (/api/ps
              context_length, clamped to the trained one) and the configured cache types (cache_type_k/v)
    compute   from nothing up to COMPUTE_SLACK x the logits and activations of one micro-batch,
              4 B x batch x (max(n_vocab, 3 x n_ff) + 2 x n_embd), plus its f16 attention mask (batch x num_ctx x 2 B);
              the batch is the one Ollama picks for num_ctx x N: 512, 1024 above 4,096 tokens, 2048 above 32,768
              (with flash attention, Ollama's default wherever the GPU has it)
    both ends widen by WEIGHTS_SLACK (rounding, the output buffer); a model with a separate image
              projector (/api/show projector_info) widens at the top by PROJECTOR_BYTES (loaded beside it; a
              vision tower inside the model's own file is in its tensor list)

The answer is the smallest N whose span holds the size. Where the spans of several counts hold it (a short context,
where one more sequence takes less than the compute buffers), the smallest: compute buffers are never taken for one
more sequence, and kvgate under-uses a server rather than over-runs it. A size between two spans is the count below
it; a size below the span of one sequence is one sequence, assumed (Ollama reports the model file's size until it has
read the load's log; or the KV cache is quantized and kvgate was not told). Embedding models and the architectures
Ollama runs with one sequence (ollama.md 4.2) are one whatever the size. Ollama before v0.30 reported its own
estimates in /api/ps, not allocations: nothing is inferred from them.

No I/O, no clock, no logging.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gateway.memory.estimate_table import format_bytes
from gateway.memory.kv import CacheType, ShapeError, ollama_kv_cache_bytes
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.ollama_answers import LoadedModel

MAX_SLOTS = 32
"""The most sequences an inference names (OLLAMA_NUM_PARALLEL beyond that is set, not inferred)."""
SPANS_CACHED = 256
"""(model, context, cache types) inferences kept: far more than the models a server holds loaded at once."""
COMPUTE_SLACK = 1.15
WEIGHTS_SLACK_SHARE = 0.005
WEIGHTS_SLACK_BYTES = 8 << 20
PROJECTOR_BYTES = 3 << 29
"""A separate image projector (mmproj: about 0.6 to 1.4 GB at f16), which /api/ps may count beside the model."""
F32_BYTES = 4
MASK_BYTES = 2
FALLBACK_N_VOCAB = 262_144
"""When the profile does not say: the largest vocabulary of common models (a wide compute span, so a smaller count)."""
ONE_SEQUENCE_ARCHITECTURES = frozenset({
    "mllama", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen3next", "lfm2", "lfm2moe", "nemotron_h",
    "nemotron_h_moe", "nemotron_h_omni",
})
"""Ollama's ``server/sched.go``: "model architecture does not currently support parallel requests"."""
FIRST_ALLOCATING_VERSION = (0, 30)


@dataclass(frozen=True, slots=True)
class SlotInference:
    """The sequences a loaded model runs at once, and how that was found.

    ``inferred`` is False when nothing could be read from the size (``reason`` says why and that one was assumed);
    ``candidates`` are the counts the size fits (several: the context is too short to tell them apart);
    ``reflects_server`` is False for a model Ollama runs alone whatever OLLAMA_NUM_PARALLEL says."""

    slots: int
    inferred: bool
    reason: str
    candidates: tuple[int, ...] = ()
    reflects_server: bool = True

    @property
    def source(self) -> str:
        return "inferred" if self.inferred else "assumed"


@dataclass(frozen=True, slots=True)
class _Span:
    slots: int
    low_bytes: int
    high_bytes: int
    kv_bytes: int


def ollama_batch(context_total_tokens: int) -> int:
    """The num_batch Ollama (v0.30+, ``automaticGenerationBatch``) picks for a load of this many KV cells; it may step
    down when memory is short, never up."""
    if context_total_tokens > 32768:
        return 2048
    if context_total_tokens > 4096:
        return 1024
    return 512


def compute_high_bytes(profile: ModelProfile, num_ctx: int, slots: int) -> int:
    """The most compute buffers a load of ``slots`` sequences of ``num_ctx`` is taken to hold (module docstring)."""
    shape = profile.shape
    batch = ollama_batch(num_ctx * slots)
    n_vocab = profile.n_vocab or FALLBACK_N_VOCAB
    n_ff = profile.n_ff or 4 * shape.n_embd
    micro_batch = F32_BYTES * batch * (max(n_vocab, 3 * n_ff) + 2 * shape.n_embd)
    mask = MASK_BYTES * batch * num_ctx
    return int(COMPUTE_SLACK * micro_batch) + mask + F32_BYTES * slots * n_vocab


def _weights_span(profile: ModelProfile, on_gpu_only: bool) -> tuple[int, int]:
    """What /api/ps counts of the weights: every layer on the GPU leaves the host's token embeddings out; a partial
    offload counts them (its CPU_Mapped buffer); a tied output layer adds its GPU copy."""
    weights = profile.weights_bytes
    embd = profile.input_embedding_bytes
    if embd is None:  # no tensor list: up to the embeddings' share of the weights, either way
        shape = profile.shape
        embd = (profile.n_vocab or FALLBACK_N_VOCAB) * shape.n_embd * 2
        embd = min(embd, weights // 2)
        low, high = (weights - embd, weights) if on_gpu_only else (weights, weights + embd)
    else:
        tied = bool(profile.tied_embeddings)
        base = weights - embd if on_gpu_only else weights
        low = high = base + (embd if tied else 0)
    slack = int(weights * WEIGHTS_SLACK_SHARE) + WEIGHTS_SLACK_BYTES
    projector = PROJECTOR_BYTES if profile.has_projector else 0
    return max(0, low - slack), high + slack + projector


@functools.lru_cache(maxsize=SPANS_CACHED)
def _spans(profile: ModelProfile, num_ctx: int, on_gpu_only: bool, type_k: CacheType,
           type_v: CacheType) -> tuple[_Span, ...]:
    """The size /api/ps may show for each count of sequences. Kept for the same arguments: every pool probe
    (``admission.pool_refresh_s``, inside a request's wait) asks again for the model it asked for before, and the
    ``MAX_SLOTS`` layouts cost milliseconds."""
    low_w, high_w = _weights_span(profile, on_gpu_only)
    spans = []
    for slots in range(1, MAX_SLOTS + 1):
        kv = ollama_kv_cache_bytes(profile.shape, num_ctx=num_ctx, num_parallel=slots, type_k=type_k, type_v=type_v)
        spans.append(_Span(slots, low_w + kv, high_w + kv + compute_high_bytes(profile, num_ctx, slots), kv))
    return tuple(spans)


def _version_allocates(version: str | None) -> bool:
    """True when this Ollama reports allocations in /api/ps (v0.30+), or the version is unknown."""
    if not version:
        return True
    parts = []
    for piece in version.lstrip("v").split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            return True
        parts.append(int(digits))
    return tuple(parts) >= FIRST_ALLOCATING_VERSION


def assumed(reason: str) -> SlotInference:
    return SlotInference(1, False, f"assumed 1: {reason}")


def infer_ollama_slots(
    profile: ModelProfile, loaded: LoadedModel, *, type_k: CacheType = CacheType.F16,
    type_v: CacheType = CacheType.F16, version: str | None = None,
) -> SlotInference:
    """The sequences Ollama runs ``loaded`` (its /api/ps entry) with, from its size and ``profile`` (/api/show)."""
    if profile.capabilities and "completion" not in profile.capabilities:
        return SlotInference(1, True, "Ollama runs embedding models with one sequence", reflects_server=False)
    architecture = profile.shape.architecture
    if architecture in ONE_SEQUENCE_ARCHITECTURES:
        return SlotInference(1, True, f"Ollama runs {architecture} models with one sequence", reflects_server=False)
    if not _version_allocates(version):
        return assumed(f"Ollama {version} reports its own estimates in /api/ps, not what the load allocated")
    num_ctx = loaded.context_tokens
    if num_ctx is None:
        return assumed("/api/ps gives no context_length (Ollama before v0.9.7)")
    if profile.shape.n_ctx_train:
        num_ctx = min(num_ctx, profile.shape.n_ctx_train)
    size = loaded.size_bytes
    on_gpu_only = loaded.size_vram_bytes >= size
    try:
        spans = _spans(profile, num_ctx, on_gpu_only, type_k, type_v)
    except ShapeError as exc:
        return assumed(f"its KV cache can't be computed ({exc})")
    one = spans[0]
    if one.kv_bytes <= 0:
        return assumed("the model keeps no KV cache per token")
    cache = "" if (type_k, type_v) == (CacheType.F16, CacheType.F16) else f", {type_k}/{type_v} cache"
    numbers = (f"/api/ps size {format_bytes(size)} at a context of {num_ctx:,} tokens{cache}; one sequence's KV "
               f"is {format_bytes(one.kv_bytes)}, the weights {format_bytes(profile.weights_bytes)}")
    if size < one.low_bytes:
        return assumed(f"{numbers}: no room for one sequence's KV beside the weights (Ollama reports the file's "
                       "size until it has read the load's log; or the KV cache is quantized: set cache_type_k/v)")
    fits = tuple(span.slots for span in spans if span.low_bytes <= size <= span.high_bytes)
    if fits:
        slots = fits[0]
        spread = "" if len(fits) == 1 else \
            f"; it fits {fits[0]} to {fits[-1]} sequences at this context, kvgate takes the fewest"
        return SlotInference(slots, True, f"inferred from {numbers}{spread}", fits)
    below = [span.slots for span in spans if span.high_bytes < size]
    slots = below[-1] if below else 1
    return SlotInference(slots, True, f"inferred from {numbers}: {slots} sequence(s) and the most compute buffers "
                                      "leave part of the size unexplained; kvgate takes the fewer", (slots,))
