"""Table-driven checks of the KV math against kv-memory.md section 4 and llama-server.md section 4."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.memory.kv import (
    CacheType,
    ModelShape,
    ServerFlags,
    ShapeError,
    bytes_per_token_split,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_cache_parts,
    llama_server_layout,
    ollama_kv_cache_bytes,
    ollama_layout,
    parse_cache_type,
    row_size_bytes,
)
from tests.memory.shapes import LLAMA_31_8B, TINY, dense_shape, swa_shape

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


@pytest.mark.parametrize(
    ("cache_type", "n_values", "expected_bytes"),
    [
        (CacheType.F32, 128, 512),
        (CacheType.F16, 128, 256),
        (CacheType.BF16, 128, 256),
        (CacheType.Q8_0, 128, 136),
        (CacheType.Q5_1, 128, 96),
        (CacheType.Q5_0, 128, 88),
        (CacheType.Q4_1, 128, 80),
        (CacheType.Q4_0, 128, 72),
        (CacheType.IQ4_NL, 128, 72),
        (CacheType.Q8_0, 0, 0),
    ],
)
def test_row_size_uses_ggml_blocks(cache_type: CacheType, n_values: int, expected_bytes: int) -> None:
    assert row_size_bytes(cache_type, n_values) == expected_bytes


def test_row_size_refuses_partial_blocks() -> None:
    with pytest.raises(ShapeError, match="divisible by 32"):
        row_size_bytes(CacheType.Q8_0, 48)


@pytest.mark.parametrize(
    ("cache_type", "bytes_per_token"),
    [
        (CacheType.F16, 128 * KIB),
        (CacheType.Q8_0, 68 * KIB),
        (CacheType.Q4_0, 36 * KIB),
        (CacheType.F32, 256 * KIB),
    ],
)
def test_llama_31_8b_bytes_per_token(cache_type: CacheType, bytes_per_token: int) -> None:
    assert kv_bytes_per_token(LLAMA_31_8B, cache_type, cache_type) == bytes_per_token


@pytest.mark.parametrize(
    ("context_tokens", "expected_bytes"), [(8192, 1 * GIB), (32768, 4 * GIB), (131072, 16 * GIB)]
)
def test_llama_31_8b_pool_at_context(context_tokens: int, expected_bytes: int) -> None:
    layout = llama_server_layout(LLAMA_31_8B, ServerFlags(ctx_size=context_tokens, n_parallel=1, unified=False))
    assert layout.cells_full == context_tokens
    assert kv_cache_bytes(LLAMA_31_8B, layout, CacheType.F16, CacheType.F16) == expected_bytes


def test_mixed_k_and_v_types() -> None:
    assert kv_bytes_per_token(LLAMA_31_8B, CacheType.Q8_0, CacheType.F16) == 32 * (1088 + 2048)


def test_one_and_two_sequences_of_16384_tokens() -> None:
    shape = dense_shape(n_layers=32, n_head_kv=8, head_dim=128)
    one = llama_server_layout(shape, ServerFlags(ctx_size=16384, n_parallel=1, unified=False))
    assert kv_cache_bytes(shape, one, CacheType.F16, CacheType.F16) == 2 * 32 * 8 * 128 * 16384 * 2 == 2 * GIB
    two = llama_server_layout(shape, ServerFlags(ctx_size=2 * 16384, n_parallel=2, unified=False))
    assert kv_cache_bytes(shape, two, CacheType.F16, CacheType.F16) == 4 * GIB
    assert ollama_kv_cache_bytes(
        shape, num_ctx=16384, num_parallel=2, type_k=CacheType.F16, type_v=CacheType.F16
    ) == (4 * GIB)


def test_tiny_model_at_c4096_np2() -> None:
    assert kv_bytes_per_token(TINY) == 256
    layout = llama_server_layout(TINY, ServerFlags(ctx_size=4096, n_parallel=2, unified=False))
    assert (layout.cells_full, layout.n_streams, layout.n_ctx_slot, layout.n_ctx_pool) == (
        2048,
        2,
        2048,
        4096,
    )
    parts = kv_cache_parts(TINY, layout)
    assert (parts.k_full, parts.v_full, parts.total) == (MIB // 2, MIB // 2, MIB)


@pytest.mark.parametrize(
    ("ctx_size", "n_parallel", "unified", "kv_per_slot", "pool", "slot", "cells", "streams"),
    [
        (4096, 4, True, None, 4096, 4096, 4096, 1),  # -np omitted: 4 slots share one pool
        (4096, 4, False, None, 4096, 1024, 1024, 4),  # explicit -np 4: split
        (1000, 1, False, None, 1024, 1024, 1024, 1),  # PAD rounds up
        (5000, 3, False, None, 5376, 1792, 1792, 3),  # PAD(5120/3)=1792 per slot
        (0, 1, False, None, 8192, 8192, 8192, 1),  # -c absent: n_ctx_train
        (20000, 1, False, None, 20224, 8192, 20224, 1),  # slot capped at n_ctx_train
        (8192, 4, True, 1024, 8192, 1024, 8192, 1),  # --kv-unified-per-slot caps the slot
        (0, 4, True, 1024, 4096, 1024, 4096, 1),  # ... and sizes the pool when -c is absent
    ],
)
def test_llama_server_layout(
    ctx_size: int,
    n_parallel: int,
    unified: bool,
    kv_per_slot: int | None,
    pool: int,
    slot: int,
    cells: int,
    streams: int,
) -> None:
    layout = llama_server_layout(
        TINY, ServerFlags(ctx_size=ctx_size, n_parallel=n_parallel, unified=unified, kv_unified_per_slot=kv_per_slot)
    )
    assert (layout.n_ctx_pool, layout.n_ctx_slot, layout.cells_full, layout.n_streams) == (
        pool,
        slot,
        cells,
        streams,
    )
    assert layout.cells_swa == 0


@pytest.mark.parametrize(
    ("unified", "n_parallel", "swa_full", "cells_swa"),
    [(True, 4, False, 4608), (False, 4, False, 1536), (False, 1, False, 1536), (False, 4, True, 8192)],
)
def test_swa_cells(unified: bool, n_parallel: int, swa_full: bool, cells_swa: int) -> None:
    shape = swa_shape(window=1024)
    layout = llama_server_layout(
        shape,
        ServerFlags(
            ctx_size=8192 * (1 if unified else n_parallel),
            n_parallel=n_parallel,
            unified=unified,
            n_ubatch=512,
            swa_full=swa_full,
        ),
    )
    assert layout.cells_full == 8192
    assert layout.cells_swa == cells_swa


def test_swa_cells_never_exceed_the_context() -> None:
    layout = llama_server_layout(swa_shape(window=4096), ServerFlags(ctx_size=2048, n_parallel=1, unified=False))
    assert layout.cells_swa == 2048


def test_swa_bytes_split_between_caches() -> None:
    shape = swa_shape(window=1024)
    full, swa = bytes_per_token_split(shape)
    assert (full, swa) == (1 * 4 * 256 * 2 * 2, 5 * 4 * 256 * 2 * 2)
    layout = llama_server_layout(shape, ServerFlags(ctx_size=32768, n_parallel=1, unified=False))
    assert kv_cache_bytes(shape, layout) == full * 32768 + swa * 1536


def test_variable_v_rows_are_padded_without_flash_attention() -> None:
    shape = ModelShape(
        architecture="deci",
        n_layers=2,
        n_embd=64,
        n_head=(4, 4),
        n_head_kv=(1, 4),
        key_length=16,
        value_length=16,
        key_length_swa=16,
        value_length_swa=16,
        swa_layers=(False, False),
        sliding_window=0,
        n_ctx_train=4096,
    )
    layout = llama_server_layout(shape, ServerFlags(ctx_size=256, n_parallel=1, unified=False))
    with_fa = kv_cache_parts(shape, layout, flash_attn=True)
    without_fa = kv_cache_parts(shape, layout, flash_attn=False)
    assert with_fa.v_full == (16 + 64) * 2 * 256
    assert without_fa.v_full == (64 + 64) * 2 * 256
    assert with_fa.k_full == without_fa.k_full


def test_mla_has_no_v_and_recurrent_state_is_per_sequence() -> None:
    mla = ModelShape(
        architecture="deepseek2",
        n_layers=2,
        n_embd=64,
        n_head=(4, 4),
        n_head_kv=(1, 1),
        key_length=576,
        value_length=512,
        key_length_swa=576,
        value_length_swa=512,
        swa_layers=(False, False),
        sliding_window=0,
        n_ctx_train=4096,
        is_mla=True,
        recurrent_state_bytes_per_seq=1000,
    )
    assert kv_bytes_per_token(mla) == 2 * 576 * 2
    layout = llama_server_layout(mla, ServerFlags(ctx_size=1024, n_parallel=2, unified=False))
    assert kv_cache_bytes(mla, layout) == 2 * 576 * 2 * 1024 + 2 * 1000


@pytest.mark.parametrize("text", ["f16", "F16", " q8_0 ", "IQ4_NL", "bf16"])
def test_parse_cache_type(text: str) -> None:
    assert parse_cache_type(text).value == text.strip().lower()


@pytest.mark.parametrize("text", ["q3_k", "", "fp16"])
def test_parse_cache_type_refuses_with_allowed_values(text: str) -> None:
    with pytest.raises(
        ValueError, match=r"allowed: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl"
    ) as info:
        parse_cache_type(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ctx_size": -1, "n_parallel": 1, "unified": False}, "must be >= 0"),
        ({"ctx_size": 4096, "n_parallel": 0, "unified": False}, r"allowed: 1\.\.256"),
        ({"ctx_size": 4096, "n_parallel": 257, "unified": True}, r"allowed: 1\.\.256"),
    ],
)
def test_layout_refuses_nonsense(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        llama_server_layout(TINY, ServerFlags(**kwargs))


def test_ollama_clamps_num_ctx_to_the_training_context() -> None:
    layout = ollama_layout(TINY, num_ctx=32768, num_parallel=2)
    assert (layout.cells_full, layout.n_streams, layout.n_ctx_slot) == (8192, 2, 8192)
    assert ollama_kv_cache_bytes(TINY, num_ctx=32768, num_parallel=2) == 256 * 8192 * 2


def test_ollama_refuses_non_positive_num_ctx() -> None:
    with pytest.raises(ShapeError, match="num_ctx is 0"):
        ollama_kv_cache_bytes(TINY, num_ctx=0, num_parallel=1)


def test_shape_checks_per_layer_lengths() -> None:
    with pytest.raises(ShapeError, match="n_head_kv has 1 entries"):
        ModelShape(
            architecture="llama",
            n_layers=2,
            n_embd=64,
            n_head=(4, 4),
            n_head_kv=(2,),
            key_length=16,
            value_length=16,
            key_length_swa=16,
            value_length_swa=16,
            swa_layers=(False, False),
            sliding_window=0,
            n_ctx_train=4096,
        )
