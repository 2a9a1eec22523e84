"""KV-cache bytes, exactly as llama.cpp allocates them.

Theory of operation
-------------------
Every attention layer ``l`` that keeps a KV cache stores, per cell (one token of one stream), one K row
of ``n_head_kv(l) * key_length(l)`` values and one V row of ``n_head_kv(l) * value_length(l)`` values. A row
of ``n`` values of a ggml type takes ``row_size(t, n) = bytes_per_block(t) * n / block_size(t)`` bytes (q8_0:
34 bytes per 32 values), so::

    kv_bytes_per_token = sum over KV layers of row_size(type_k, K row) + row_size(type_v, V row)

MLA models store no V row. Sliding-window (SWA) layers use their own head sizes (``key_length_swa``).

How many cells llama-server allocates (llama-server.md sections 3 and 4)::

    n_ctx      = PAD(c or n_ctx_train, 256)                 PAD rounds up to a multiple of 256
    unified:     1 stream  of n_ctx cells; every slot may grow to n_ctx
    split:       n_parallel streams of PAD(n_ctx / n_parallel, 256) cells each
    SWA layers:  PAD(min(cells, n_swa * (n_parallel if unified else 1) + n_ubatch), 256) cells per stream
    total      = streams * (cells * full_bytes_per_token + swa_cells * swa_bytes_per_token)
               + n_parallel * recurrent_state_bytes_per_seq

``ctx_size=0`` means "-c not given": the context comes from ``n_ctx_train`` (``--fit`` may still lower it when
free memory is short, which no formula can know; read it back from ``/props``).

Everything here is pure: no I/O, no clock, no logging. Problems in the metadata become exceptions that name
the key; doubts (an architecture kvgate does not know) become ``ModelShape.warnings`` for the caller to log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

LLAMA_MAX_SEQ = 256
CTX_PAD_TOKENS = 256


class CacheType(StrEnum):
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"
    Q4_1 = "q4_1"
    Q5_0 = "q5_0"
    Q5_1 = "q5_1"
    IQ4_NL = "iq4_nl"


# ggml type traits: (values per block, bytes per block); ggml/src/ggml.c type_traits
_BLOCKS: dict[CacheType, tuple[int, int]] = {
    CacheType.F32: (1, 4),
    CacheType.F16: (1, 2),
    CacheType.BF16: (1, 2),
    CacheType.Q8_0: (32, 34),
    CacheType.Q4_0: (32, 18),
    CacheType.Q4_1: (32, 20),
    CacheType.Q5_0: (32, 22),
    CacheType.Q5_1: (32, 24),
    CacheType.IQ4_NL: (32, 18),
}

ALLOWED_CACHE_TYPES = ", ".join(t.value for t in CacheType)


class ShapeError(ValueError):
    """Raised when model hyper-parameters are inconsistent or a value is out of range."""


class MissingMetadataKey(ShapeError):
    """Raised when a metadata key needed for KV sizing is absent."""

    def __init__(self, key: str, detail: str = "") -> None:
        self.key = key
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"model metadata has no '{key}'{suffix}; it is needed to size the KV cache")


class NullMetadataArray(MissingMetadataKey):
    """Raised when a per-layer array came back as null (Ollama /api/show without verbose)."""

    def __init__(self, key: str) -> None:
        super().__init__(key, "the array came back as null: ask /api/show again with verbose=true")


def parse_cache_type(value: str) -> CacheType:
    """Parse a -ctk/-ctv value ("f16", "Q8_0"), refusing anything else with the allowed values."""
    try:
        return CacheType(value.strip().lower())
    except ValueError:
        raise ValueError(f"unknown KV cache type {value!r}; allowed: {ALLOWED_CACHE_TYPES}") from None


def block_size(cache_type: CacheType) -> int:
    return _BLOCKS[cache_type][0]


def row_size_bytes(cache_type: CacheType, n_values: int) -> int:
    """Bytes of one row of ``n_values`` values, as ``ggml_row_size`` (which asserts whole blocks)."""
    values_per_block, bytes_per_block = _BLOCKS[cache_type]
    if n_values < 0:
        raise ShapeError(f"row of {n_values} values: must not be negative")
    if n_values % values_per_block:
        raise ShapeError(
            f"a {cache_type} cache row must hold whole blocks of {values_per_block} values; "
            f"{n_values} is not divisible by {values_per_block} (use f16 for this model)"
        )
    return bytes_per_block * n_values // values_per_block


def pad_tokens(n_tokens: int, multiple: int = CTX_PAD_TOKENS) -> int:
    """Round up to a multiple (llama.cpp GGML_PAD)."""
    return (n_tokens + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class ModelShape:
    """The hyper-parameters that decide KV size. Per-layer tuples have ``n_layers`` entries."""

    architecture: str
    n_layers: int
    n_embd: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    key_length: int
    value_length: int
    key_length_swa: int
    value_length_swa: int
    swa_layers: tuple[bool, ...]
    sliding_window: int
    n_ctx_train: int
    is_mla: bool = False
    recurrent_state_bytes_per_seq: int = 0
    n_layers_with_kv: int | None = (
        None  # leading layers that own a KV cache (gemma3n/4 share the rest); None = all
    )
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.n_layers < 0:
            raise ShapeError(f"n_layers is {self.n_layers}; must be >= 0")
        for name in ("n_head", "n_head_kv", "swa_layers"):
            got = len(getattr(self, name))
            if got != self.n_layers:
                raise ShapeError(f"{name} has {got} entries; expected one per layer ({self.n_layers})")
        sizes = (self.key_length, self.value_length, self.key_length_swa, self.value_length_swa)
        if (
            min(sizes) < 0
            or self.sliding_window < 0
            or self.n_ctx_train < 0
            or min(self.n_head_kv, default=0) < 0
        ):
            raise ShapeError(f"negative hyper-parameter in {self.architecture} shape")
        if self.n_layers_with_kv is not None and not 0 <= self.n_layers_with_kv <= self.n_layers:
            raise ShapeError(
                f"n_layers_with_kv is {self.n_layers_with_kv}; must be within 0..{self.n_layers}"
            )

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> ModelShape:
        """Build from GGUF key/values (a GGUF file, Ollama model_info); see ``gateway.memory.metadata``."""
        from gateway.memory.metadata import shape_from_metadata

        return shape_from_metadata(metadata)

    @property
    def has_swa(self) -> bool:
        return self.sliding_window > 0 and any(self.swa_layers)

    def kv_layers(self) -> range:
        return range(self.n_layers if self.n_layers_with_kv is None else self.n_layers_with_kv)

    def k_values(self, layer: int) -> int:
        head = self.key_length_swa if self.swa_layers[layer] else self.key_length
        return head * self.n_head_kv[layer]

    def v_values(self, layer: int) -> int:
        head = self.value_length_swa if self.swa_layers[layer] else self.value_length
        return head * self.n_head_kv[layer]


@dataclass(frozen=True)
class RowBytes:
    """Bytes one cell (token) takes in each part of the cache, summed over layers."""

    k_full: int
    v_full: int
    k_swa: int
    v_swa: int


def row_bytes(
    shape: ModelShape, type_k: CacheType = CacheType.F16, type_v: CacheType = CacheType.F16, *, flash_attn: bool = True
) -> RowBytes:
    """Per-cell K and V bytes of the full-context and SWA caches.

    Without flash attention V is stored transposed, and when V rows differ between layers llama.cpp pads every
    V row to the largest one (TAG_V_CACHE_VARIABLE). MLA models store no V.
    """
    v_max = max((shape.v_values(il) for il in range(shape.n_layers)), default=0)
    sums = {"k_full": 0, "v_full": 0, "k_swa": 0, "v_swa": 0}
    for il in shape.kv_layers():
        part = "swa" if shape.has_swa and shape.swa_layers[il] else "full"
        sums[f"k_{part}"] += row_size_bytes(type_k, shape.k_values(il))
        if not shape.is_mla:
            sums[f"v_{part}"] += row_size_bytes(type_v, shape.v_values(il) if flash_attn else v_max)
    return RowBytes(**sums)


def bytes_per_token_split(
    shape: ModelShape, type_k: CacheType = CacheType.F16, type_v: CacheType = CacheType.F16, *, flash_attn: bool = True
) -> tuple[int, int]:
    """(bytes per cell of the full-context cache, bytes per cell of the SWA cache)."""
    rows = row_bytes(shape, type_k, type_v, flash_attn=flash_attn)
    return rows.k_full + rows.v_full, rows.k_swa + rows.v_swa


def kv_bytes_per_token(
    shape: ModelShape, type_k: CacheType = CacheType.F16, type_v: CacheType = CacheType.F16
) -> int:
    """Bytes one token adds across all KV layers (SWA layers counted at their per-token rate)."""
    full, swa = bytes_per_token_split(shape, type_k, type_v)
    return full + swa


@dataclass(frozen=True)
class KvLayout:
    """How many cells llama-server allocates; ``cells_*`` are per stream."""

    n_ctx_pool: int  # tokens the whole pool holds (all slots together)
    n_ctx_slot: int  # tokens one slot may use (/props default_generation_settings.n_ctx)
    n_parallel: int
    unified: bool
    cells_full: int
    cells_swa: int  # 0 when the model has no sliding-window layers
    n_streams: int


def _check_parallel(n_parallel: int) -> None:
    if not 1 <= n_parallel <= LLAMA_MAX_SEQ:
        raise ShapeError(f"parallel sequences is {n_parallel}; allowed: 1..{LLAMA_MAX_SEQ}")


@dataclass(frozen=True, slots=True)
class ServerFlags:
    """The llama-server flags its KV layout follows: ``-c ctx_size`` (0: not given, the model's training context),
    ``-np n_parallel``, ``-kvu`` (unified), ``-ub n_ubatch``, ``--swa-full``, ``-b n_batch``, and the per-slot size a
    unified pool was seen to give (``kv_unified_per_slot``, from a log; None: unknown)."""

    ctx_size: int
    n_parallel: int
    unified: bool
    n_ubatch: int = 512
    swa_full: bool = False
    kv_unified_per_slot: int | None = None
    n_batch: int = 2048


def llama_server_layout(shape: ModelShape, flags: ServerFlags) -> KvLayout:
    """Cells llama-server allocates for ``-c ctx_size -np n_parallel [-kvu]`` (ctx_size 0 = -c not given)."""
    ctx_size, n_parallel, unified, n_ubatch = flags.ctx_size, flags.n_parallel, flags.unified, flags.n_ubatch
    swa_full, kv_unified_per_slot, n_batch = flags.swa_full, flags.kv_unified_per_slot, flags.n_batch
    if ctx_size < 0:
        raise ShapeError(
            f"context size is {ctx_size} tokens; must be >= 0 (0 = the model's training context)"
        )
    _check_parallel(n_parallel)
    if n_ubatch < 1 or n_batch < 1:
        raise ShapeError(f"batch sizes must be >= 1 (n_batch={n_batch}, n_ubatch={n_ubatch})")
    per_slot_cap = kv_unified_per_slot or 0
    if ctx_size == 0 and per_slot_cap > 0:
        ctx_size = n_parallel * per_slot_cap  # --kv-unified-per-slot sizes the pool when -c is absent
    n_ctx_raw = ctx_size or shape.n_ctx_train
    if n_ctx_raw <= 0:
        raise ShapeError("context size is 0 and the model has no training context; pass a context size")
    n_ctx = pad_tokens(n_ctx_raw)
    if unified:
        n_ctx_seq, n_streams = n_ctx, 1
    else:
        n_ctx_seq, n_streams = pad_tokens(n_ctx // n_parallel), n_parallel
        n_ctx = n_ctx_seq * n_parallel
    ubatch = min(min(n_ctx_raw, n_batch), n_ubatch)
    cells_swa = 0
    if shape.has_swa:
        window = shape.sliding_window * (n_parallel if unified else 1) + ubatch
        cells_swa = n_ctx_seq if swa_full else pad_tokens(min(n_ctx_seq, window))
    slot = n_ctx_seq if per_slot_cap <= 0 else min(n_ctx_seq, per_slot_cap)
    if shape.n_ctx_train > 0:
        slot = min(slot, shape.n_ctx_train)
    return KvLayout(
        n_ctx_pool=n_ctx,
        n_ctx_slot=slot,
        n_parallel=n_parallel,
        unified=unified,
        cells_full=n_ctx_seq,
        cells_swa=cells_swa,
        n_streams=n_streams,
    )


@dataclass(frozen=True)
class KvBytes:
    """The parts of a KV allocation, as llama.cpp logs them (``K (f16): .. MiB, V (f16): .. MiB``)."""

    k_full: int
    v_full: int
    k_swa: int
    v_swa: int
    recurrent: int

    @property
    def total(self) -> int:
        return self.k_full + self.v_full + self.k_swa + self.v_swa + self.recurrent


def kv_cache_parts(
    shape: ModelShape,
    layout: KvLayout,
    type_k: CacheType = CacheType.F16,
    type_v: CacheType = CacheType.F16,
    *,
    flash_attn: bool = True,
) -> KvBytes:
    """K and V bytes of the full-context and SWA caches, all streams, plus recurrent state."""
    rows = row_bytes(shape, type_k, type_v, flash_attn=flash_attn)
    full_cells = layout.cells_full * layout.n_streams
    swa_cells = layout.cells_swa * layout.n_streams
    return KvBytes(
        k_full=rows.k_full * full_cells,
        v_full=rows.v_full * full_cells,
        k_swa=rows.k_swa * swa_cells,
        v_swa=rows.v_swa * swa_cells,
        recurrent=shape.recurrent_state_bytes_per_seq * layout.n_parallel,
    )


def kv_cache_bytes(
    shape: ModelShape,
    layout: KvLayout,
    type_k: CacheType = CacheType.F16,
    type_v: CacheType = CacheType.F16,
    *,
    flash_attn: bool = True,
) -> int:
    """Exact bytes llama-server allocates for the KV cache: K+V, full and SWA, all streams, recurrent."""
    return kv_cache_parts(shape, layout, type_k, type_v, flash_attn=flash_attn).total


def ollama_layout(shape: ModelShape, *, num_ctx: int, num_parallel: int) -> KvLayout:
    """Ollama (v0.30+) starts llama-server with ``-c num_ctx*num_parallel -np num_parallel``: split slots.

    Ollama first clamps num_ctx to the model's training context (ollama.md 3.1, /api/ps context_length).
    """
    if num_ctx <= 0:
        raise ShapeError(f"num_ctx is {num_ctx} tokens; must be > 0")
    _check_parallel(num_parallel)
    if shape.n_ctx_train > 0:
        num_ctx = min(num_ctx, shape.n_ctx_train)
    return llama_server_layout(
        shape, ServerFlags(ctx_size=num_ctx * num_parallel, n_parallel=num_parallel, unified=False)
    )


def ollama_kv_cache_bytes(
    shape: ModelShape,
    *,
    num_ctx: int,
    num_parallel: int,
    type_k: CacheType = CacheType.F16,
    type_v: CacheType = CacheType.F16,
) -> int:
    """KV bytes of a model Ollama loads with ``num_ctx`` and ``OLLAMA_NUM_PARALLEL``."""
    layout = ollama_layout(shape, num_ctx=num_ctx, num_parallel=num_parallel)
    return kv_cache_bytes(shape, layout, type_k, type_v)
