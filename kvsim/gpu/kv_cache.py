"""The KV cache the simulated runtimes allocate, written from llama.cpp's and Ollama's behaviour.

Sources: /work/shared/facts/llama-server.md sections 3-4 and 7 (llama.cpp ``llama_context`` and
``llama_kv_cache[_iswa]``), ollama.md section 4.1 (how Ollama v0.30+ starts llama-server), kv-memory.md. This
module is the simulator's own reading of those sheets, kept apart from the gateway's memory math on purpose:
``tests/kvsim/test_kv_crosscheck.py`` compares the two, so a mistake in either shows up as a disagreement.

What one cell (one token of one stream) holds
---------------------------------------------
Every layer with attention keeps one K row and one V row per cell::

    K row = n_head_kv(layer) x key_length   values of type_k       (key_length_swa on a sliding-window layer)
    V row = n_head_kv(layer) x value_length values of type_v
    bytes of a row of n values = n / values_per_block(t) x bytes_per_block(t)      (ggml_row_size)

A layer with ``n_head_kv`` 0 has no attention and no KV. Quantized rows must hold whole blocks of 32 values.

How many cells llama-server allocates (``-c C -np N [-kvu]``)
------------------------------------------------------------
::

    n_ctx = pad256(C, or n_ctx_train when C is 0)
    unified (-kvu, or -np left to auto):  1 stream of n_ctx cells; every slot may grow to the whole pool
    split (explicit -np N):               N streams of n_ctx_seq = pad256(n_ctx // N) cells each
    sliding-window layers:                pad256(min(n_ctx_seq, n_swa x (N if unified else 1) + n_ubatch)) cells
                                          per stream (all of n_ctx_seq with --swa-full)
    a slot may use min(n_ctx_seq, n_ctx_train) cells

Ollama (v0.30+) clamps ``num_ctx`` to the trained context and starts llama-server with ``-c num_ctx x
num_parallel -np num_parallel``: split slots, ``num_ctx x num_parallel`` tokens of KV reserved at load.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvsim.modelspec import ModelSpec

CELL_PAD = 256  # llama_context pads the context to a multiple of 256 cells
DEFAULT_UBATCH = 512  # llama-server -ub


class CacheType(StrEnum):
    """``-ctk`` / ``-ctv`` values (``OLLAMA_KV_CACHE_TYPE`` is passed through as both)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    Q8_0 = "q8_0"
    Q5_1 = "q5_1"
    Q5_0 = "q5_0"
    Q4_1 = "q4_1"
    Q4_0 = "q4_0"
    IQ4_NL = "iq4_nl"


# (values per block, bytes per block): the ggml type traits table of the fact sheets
GGML_BLOCKS: dict[CacheType, tuple[int, int]] = {
    CacheType.F32: (1, 4),
    CacheType.F16: (1, 2),
    CacheType.BF16: (1, 2),
    CacheType.Q8_0: (32, 34),
    CacheType.Q5_1: (32, 24),
    CacheType.Q5_0: (32, 22),
    CacheType.Q4_1: (32, 20),
    CacheType.Q4_0: (32, 18),
    CacheType.IQ4_NL: (32, 18),
}


def parse_cache_type(value: str) -> CacheType:
    try:
        return CacheType(value.strip().lower())
    except ValueError:
        allowed = ", ".join(t.value for t in CacheType)
        raise ValueError(f"unknown KV cache type {value!r}; allowed: {allowed}") from None


def pad_cells(n: int) -> int:
    return -(-n // CELL_PAD) * CELL_PAD


def row_bytes(cache_type: CacheType, n_values: int) -> int:
    per_block, block_bytes = GGML_BLOCKS[cache_type]
    blocks, rest = divmod(n_values, per_block)
    if rest:
        raise ValueError(f"a {cache_type} KV row holds whole blocks of {per_block} values, not {n_values}")
    return blocks * block_bytes


@dataclass(frozen=True)
class AttentionLayers:
    """What decides a model's KV size: per-layer KV heads (0 = no attention), head sizes, sliding window."""

    n_head_kv: tuple[int, ...]
    key_length: int
    value_length: int
    sliding: tuple[bool, ...]  # per layer: a sliding-window layer
    sliding_window: int = 0  # n_swa
    key_length_swa: int | None = None  # None: the full-attention size
    value_length_swa: int | None = None
    n_ctx_train: int = 0

    @classmethod
    def of(cls, spec: ModelSpec) -> AttentionLayers:
        a = spec.arch
        heads = 0 if spec.is_embedding else a.n_head_kv  # an embedding model keeps no KV cache
        return cls(
            n_head_kv=(heads,) * a.n_layers,
            key_length=a.head_dim,
            value_length=a.head_dim,
            sliding=spec.swa_layers,
            sliding_window=spec.sliding_window,
            n_ctx_train=spec.n_ctx_train,
        )

    @property
    def has_sliding(self) -> bool:
        return self.sliding_window > 0 and any(self.sliding)

    def cell_bytes(self, type_k: CacheType, type_v: CacheType) -> tuple[int, int]:
        """Bytes of one cell summed over layers: (full-attention layers, sliding-window layers)."""
        full = swa = 0
        for heads, sliding in zip(self.n_head_kv, self.sliding, strict=True):
            if heads == 0:
                continue
            slides = sliding and self.sliding_window > 0
            k_len = self.key_length_swa if slides and self.key_length_swa is not None else self.key_length
            v_len = self.value_length_swa if slides and self.value_length_swa is not None else self.value_length
            layer = row_bytes(type_k, heads * k_len) + row_bytes(type_v, heads * v_len)
            if slides:
                swa += layer
            else:
                full += layer
        return full, swa


@dataclass(frozen=True)
class KvCells:
    """The cells of one allocation; ``full_cells`` and ``swa_cells`` are per stream."""

    n_ctx: int  # the whole pool, in tokens
    slot_ctx: int  # what one slot may use (/props n_ctx, /api/ps context_length before padding)
    n_slots: int
    unified: bool
    streams: int
    full_cells: int
    swa_cells: int


def llama_server_cells(
    layers: AttentionLayers,
    *,
    ctx_size: int,
    n_parallel: int,
    unified: bool,
    n_ubatch: int = DEFAULT_UBATCH,
    swa_full: bool = False,
) -> KvCells:
    """The cells llama-server allocates for ``-c ctx_size -np n_parallel`` (ctx_size 0: the trained context)."""
    if n_parallel < 1:
        raise ValueError(f"n_parallel must be >= 1, got {n_parallel}")
    n_ctx = pad_cells(ctx_size or layers.n_ctx_train)
    if n_ctx <= 0:
        raise ValueError("no context size: -c is 0 and the model has no trained context")
    if unified:
        per_stream, streams = n_ctx, 1
    else:
        per_stream, streams = pad_cells(n_ctx // n_parallel), n_parallel
        n_ctx = per_stream * n_parallel
    swa_cells = 0
    if layers.has_sliding:
        window = layers.sliding_window * (n_parallel if unified else 1) + n_ubatch
        swa_cells = per_stream if swa_full else pad_cells(min(per_stream, window))
    slot_ctx = min(per_stream, layers.n_ctx_train) if layers.n_ctx_train > 0 else per_stream
    return KvCells(n_ctx, slot_ctx, n_parallel, unified, streams, per_stream, swa_cells)


def ollama_cells(layers: AttentionLayers, *, num_ctx: int, num_parallel: int) -> KvCells:
    """Ollama v0.30+: num_ctx clamped to the trained context, then ``-c num_ctx*num_parallel -np num_parallel``."""
    if num_ctx < 1:
        raise ValueError(f"num_ctx must be >= 1, got {num_ctx}")
    if layers.n_ctx_train > 0:
        num_ctx = min(num_ctx, layers.n_ctx_train)
    return llama_server_cells(layers, ctx_size=num_ctx * num_parallel, n_parallel=num_parallel, unified=False)


def kv_bytes(
    layers: AttentionLayers, cells: KvCells, type_k: CacheType = CacheType.F16, type_v: CacheType | None = None
) -> int:
    """Bytes of the K and V buffers of every stream, full-attention and sliding-window caches together."""
    full, swa = layers.cell_bytes(type_k, type_v or type_k)
    return cells.streams * (full * cells.full_cells + swa * cells.swa_cells)


def layer_kv_bytes(
    layers: AttentionLayers, cells: KvCells, type_k: CacheType = CacheType.F16, type_v: CacheType | None = None
) -> tuple[int, ...]:
    """``kv_bytes`` layer by layer (a layer's K and V buffers of every stream); they sum to ``kv_bytes``. When
    llama.cpp keeps a layer on the CPU, its KV goes with it."""
    type_v = type_v or type_k
    out = []
    for heads, sliding in zip(layers.n_head_kv, layers.sliding, strict=True):
        if heads == 0:
            out.append(0)
            continue
        slides = sliding and layers.sliding_window > 0
        k_len = layers.key_length_swa if slides and layers.key_length_swa is not None else layers.key_length
        v_len = layers.value_length_swa if slides and layers.value_length_swa is not None else layers.value_length
        row = row_bytes(type_k, heads * k_len) + row_bytes(type_v, heads * v_len)
        out.append(cells.streams * row * (cells.swa_cells if slides else cells.full_cells))
    return tuple(out)


def bytes_per_token(layers: AttentionLayers, type_k: CacheType = CacheType.F16, type_v: CacheType | None = None) -> int:
    """What one more token costs where the cache grows per token (transformers-style): every layer's K and V row."""
    full, swa = layers.cell_bytes(type_k, type_v or type_k)
    return full + swa


def ollama_kv_bytes(
    spec: ModelSpec, *, num_ctx: int, num_parallel: int, cache_type: CacheType = CacheType.F16
) -> int:
    """The KV cache of ``spec`` loaded by Ollama with ``num_ctx`` and ``OLLAMA_NUM_PARALLEL``."""
    layers = AttentionLayers.of(spec)
    return kv_bytes(layers, ollama_cells(layers, num_ctx=num_ctx, num_parallel=num_parallel), cache_type)


def ollama_layer_kv_bytes(
    spec: ModelSpec, *, num_ctx: int, num_parallel: int, cache_type: CacheType = CacheType.F16
) -> tuple[int, ...]:
    """``ollama_kv_bytes`` layer by layer."""
    layers = AttentionLayers.of(spec)
    return layer_kv_bytes(layers, ollama_cells(layers, num_ctx=num_ctx, num_parallel=num_parallel), cache_type)
