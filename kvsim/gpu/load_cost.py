"""What a model load costs on the GPU, and what Ollama predicts it will cost before loading.

Actual allocation (what llama-server allocates and Ollama E3 reports in ``/api/ps``)::

    weights  = the GPU part of the tensors (``weights.weight_bytes``)
    KV       = ollama_kv_bytes(spec, num_ctx, num_parallel, cache_type)   (kv_cache: llama.cpp's allocation)
    compute  = 4 B x num_batch x (n_vocab + 2 x n_embd)   the logits and activations of one micro-batch,
               the dominant term of llama.cpp's compute buffer with flash attention (an approximation:
               llama.cpp has no closed form; Llama 3.1 8B at batch 512 gives 258 MiB, the log says ~258)

llama.cpp's automatic fit (``--fit``, ``LLAMA_ARG_FIT``, on by default; Ollama E3 passes ``-c`` but no ``-ngl``, so
only the GPU layer count is adjusted) when that does not fit the device's free memory minus the fit target
(``-fitt``, 1024 MiB per device)::

    budget     = free - fit target - compute - the weights outside the repeating layers (output, norms)
    gpu layers = the most trailing layers whose weights + KV fit the budget (llama.cpp offloads the last
                 layers: ``i_gpu_start = n_layer - n_gpu_layers``); the others, their weights and their KV,
                 stay in system RAM, and so does the CPU_Mapped token embedding (counted in /api/ps ``size``)

Ollama's predictions (which decide eviction, not the allocation itself):

    E3  PredictServerVRAM = file size + 2 x blocks x min(head_count_kv) x (embd / max(head_count)) x ctx x 2
        (f16 assumed, SWA and key_length ignored) + a batch surcharge (0 / 768 MiB / 2 GiB for 512/1024/2048)
    E2  file size + KV at Ollama's bytes/element (q8_0 = 1, q4_0 = 0.5; gemma3 SWA layers hold
        num_parallel x window + batch) + the llama full-offload graph + 457 MiB CUDA minimum per GPU

Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvsim.catalog import ModelSpec
from kvsim.gpu.kv_cache import CacheType, ollama_kv_bytes, ollama_layer_kv_bytes
from kvsim.gpu.vgpu import GIB, MIB

BATCH_DEFAULT, BATCH_MEDIUM, BATCH_LARGE = 512, 1024, 2048
CUDA_MINIMUM_BYTES = 457 * MIB
FIT_TARGET_BYTES = 1024 * MIB  # llama.cpp -fitt default: free memory --fit leaves on each device
_OLLAMA_ELEM_BYTES = {CacheType.F16: 2.0, CacheType.Q8_0: 1.0, CacheType.Q4_0: 0.5, CacheType.F32: 4.0}


@dataclass(frozen=True)
class LoadCost:
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes


@dataclass(frozen=True)
class Offload:
    """A partial offload: ``gpu_layers`` of ``n_layers`` repeating layers on the GPU, the rest in system RAM."""

    n_layers: int
    gpu_layers: int
    host_weights_bytes: int  # the weights of the CPU layers
    host_kv_bytes: int  # the KV of the CPU layers
    host_mapped_bytes: int  # the CPU_Mapped model buffer (token embeddings), in /api/ps size once offloaded

    @property
    def cpu_layers(self) -> int:
        return self.n_layers - self.gpu_layers

    @property
    def host_bytes(self) -> int:
        """The system memory /api/ps attributes to the runner (``size`` - ``size_vram``)."""
        return self.host_weights_bytes + self.host_kv_bytes + self.host_mapped_bytes


def fit_to_free(
    spec: ModelSpec,
    cost: LoadCost,
    *,
    num_ctx: int,
    num_parallel: int,
    cache_type: CacheType,
    free_bytes: int,
    devices: int = 1,
    fit_target_bytes: int = FIT_TARGET_BYTES,
) -> tuple[LoadCost, Offload | None]:
    """llama.cpp ``--fit`` on ``cost`` (every layer on the GPU): unchanged when it fits ``free_bytes`` minus the fit
    target (per device), else the GPU part of the load and what stays in system RAM. With no room even for the
    non-layer buffers, zero layers: the allocation of those then fails as it would."""
    budget = free_bytes - fit_target_bytes * devices
    if cost.total_bytes <= budget:
        return cost, None
    layer_w = spec.layer_weights
    layer_kv = (
        ollama_layer_kv_bytes(spec, num_ctx=num_ctx, num_parallel=num_parallel, cache_type=cache_type)
        if cost.kv_bytes
        else (0,) * len(layer_w)
    )
    outside_w = cost.weights_bytes - sum(layer_w)
    room = budget - cost.compute_bytes - outside_w
    gpu_layers = 0
    for il in reversed(range(len(layer_w))):  # the last layers go to the GPU first
        need = layer_w[il] + layer_kv[il]
        if need > room:
            break
        room -= need
        gpu_layers += 1
    first_gpu = len(layer_w) - gpu_layers
    gpu_cost = replace(
        cost,
        weights_bytes=outside_w + sum(layer_w[first_gpu:]),
        kv_bytes=sum(layer_kv[first_gpu:]),
    )
    offload = Offload(
        n_layers=len(layer_w),
        gpu_layers=gpu_layers,
        host_weights_bytes=sum(layer_w[:first_gpu]),
        host_kv_bytes=sum(layer_kv[:first_gpu]),
        host_mapped_bytes=spec.weights.host_bytes,
    )
    return gpu_cost, offload


def compute_bytes(spec: ModelSpec, num_batch: int) -> int:
    a = spec.arch
    if spec.is_embedding:
        return 4 * num_batch * a.n_embd * 8
    return 4 * num_batch * (a.n_vocab + 2 * a.n_embd)


def load_cost(
    spec: ModelSpec,
    *,
    num_ctx: int,
    num_parallel: int,
    num_batch: int,
    cache_type: CacheType,
    dynamic_kv: bool,
) -> LoadCost:
    """The bytes a load allocates on the GPU (KV 0 in dynamic mode: it grows per token instead)."""
    kv = 0
    if not dynamic_kv and not spec.is_embedding:
        kv = ollama_kv_bytes(spec, num_ctx=num_ctx, num_parallel=num_parallel, cache_type=cache_type)
    return LoadCost(spec.weights.gpu_bytes, kv, compute_bytes(spec, num_batch))


def predicted_vram_e3(spec: ModelSpec, *, ctx_total_tokens: int) -> int:
    """``llm.PredictServerVRAM``: file size plus an f16 KV guess."""
    a = spec.arch
    head_dim_guess = a.n_embd // a.n_head
    kv = 2 * a.n_layers * a.n_head_kv * head_dim_guess * ctx_total_tokens * 2
    return spec.file_bytes + kv


def batch_surcharge(num_batch: int) -> int:
    if num_batch >= BATCH_LARGE:
        return 2 * GIB
    if num_batch >= BATCH_MEDIUM:
        return 768 * MIB
    return 0


def auto_batch_e3(ctx_total_tokens: int, predicted_bytes: int, available_bytes: int) -> int:
    """``automaticGenerationBatch`` with flash attention on: larger batches for long contexts, if they fit."""
    batch = BATCH_DEFAULT
    if ctx_total_tokens > 32768:
        batch = BATCH_LARGE
    elif ctx_total_tokens > 4096:
        batch = BATCH_MEDIUM
    while batch > BATCH_DEFAULT and not _batch_fits(batch, predicted_bytes, available_bytes):
        batch = BATCH_MEDIUM if batch > BATCH_MEDIUM else BATCH_DEFAULT
    return batch


def _batch_fits(batch: int, predicted: int, available: int) -> bool:
    if predicted == 0 or available <= 0:
        return True
    threshold = available * 80 // 100
    headroom = 60 if batch >= BATCH_LARGE else 75
    if predicted > threshold or predicted > available * headroom // 100:
        return False
    return batch_surcharge(batch) <= threshold - predicted


def predicted_vram_e2(
    spec: ModelSpec, *, num_ctx: int, num_parallel: int, num_batch: int, cache_type: CacheType
) -> int:
    """Ollama E1/E2's estimate (``GraphSize`` plus the per-GPU minimum)."""
    a = spec.arch
    elem = _OLLAMA_ELEM_BYTES.get(cache_type, 2.0)
    ctx = num_ctx * num_parallel
    per_token_layer = 2 * a.head_dim * a.n_head_kv * elem
    kv = 0.0
    for is_swa in spec.swa_layers:
        cells = min(ctx, num_parallel * spec.sliding_window + num_batch) if is_swa else ctx
        kv += per_token_layer * cells
    graph = max(
        4 * num_batch * (1 + 4 * a.n_embd + ctx * (1 + a.n_head)),
        4 * num_batch * (a.n_embd + a.n_vocab),
    )
    return spec.file_bytes + int(kv) + graph + CUDA_MINIMUM_BYTES


def place(total_bytes: int, predicted_bytes: int, free_by_device: dict[int, int]) -> dict[int, int]:
    """Ollama's placement: one GPU when the prediction is within 80% of its free memory (the one with the most
    free), else split across all GPUs in proportion to their free memory (llama.cpp's default tensor split)."""
    fitting = [d for d, free in free_by_device.items() if predicted_bytes <= max(free, 0) * 80 // 100]
    if len(free_by_device) == 1 or fitting:
        best = max(fitting or free_by_device, key=lambda d: (free_by_device[d], -d))
        return {best: total_bytes}
    weights = {d: max(free, 1) for d, free in free_by_device.items()}
    total_weight = sum(weights.values())
    shares = {d: total_bytes * w // total_weight for d, w in weights.items()}
    first = min(shares)
    shares[first] += total_bytes - sum(shares.values())
    return shares


def split_like(nbytes: int, shares: dict[int, int]) -> dict[int, int]:
    """``nbytes`` spread over the devices in the proportions of ``shares``."""
    total = sum(shares.values()) or 1
    out = {d: nbytes * share // total for d, share in shares.items()}
    first = min(out)
    out[first] += nbytes - sum(out.values())
    return out


def buffers(cost: LoadCost, shares: dict[int, int]) -> list[dict[int, int]]:
    """The allocations llama.cpp makes, in order (model buffers, KV buffers, compute buffers), per device."""
    return [split_like(part, shares) for part in (cost.weights_bytes, cost.kv_bytes, cost.compute_bytes) if part]
