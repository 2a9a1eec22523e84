"""Hyper-parameters from GGUF metadata: the vocabulary files shipped in gateway/data/vocab, and bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.memory.kv import (
    CacheType,
    MissingMetadataKey,
    ModelShape,
    NullMetadataArray,
    ServerFlags,
    ShapeError,
    bytes_per_token_split,
    kv_bytes_per_token,
    llama_server_layout,
)
from gateway.memory.metadata import per_layer_arrays_missing
from gateway.support.gguf_reader import read_gguf

VOCAB_DIR = Path(__file__).resolve().parents[2] / "gateway" / "data" / "vocab"

GEMMA4_KV_HEADS = (8, 8, 8, 8, 8, 2) * 5
GEMMA4_SWA = (True, True, True, True, True, False) * 5

# file, arch, layers, kv heads (layer 0), K/V head, n_ctx_train, f16 bytes/token
VOCAB_CASES = [
    ("ggml-vocab-llama-bpe.gguf", "llama", 32, 8, 128, 8192, 131072),
    ("ggml-vocab-llama-spm.gguf", "llama", 32, 32, 128, 4096, 524288),
    ("ggml-vocab-deepseek-coder.gguf", "llama", 32, 32, 128, 16384, 524288),
    ("ggml-vocab-qwen2.gguf", "qwen2", 32, 32, 128, 32768, 524288),
    ("ggml-vocab-phi-3.gguf", "phi3", 32, 32, 96, 4096, 393216),
    ("ggml-vocab-gpt-2.gguf", "gpt2", 12, 12, 64, 1024, 36864),
    ("ggml-vocab-gemma-4.gguf", "gemma4", 30, 8, 512, 262144, 5 * 2 * 512 * 4 + 25 * 8 * 256 * 4),
]


def test_every_vocab_file_is_covered() -> None:
    assert {case[0] for case in VOCAB_CASES} == {p.name for p in VOCAB_DIR.glob("*.gguf")}


@pytest.mark.parametrize(
    ("name", "arch", "layers", "kv_heads", "head", "n_ctx_train", "bytes_per_token"), VOCAB_CASES
)
def test_vocab_file_hyper_parameters(
    name: str, arch: str, layers: int, kv_heads: int, head: int, n_ctx_train: int, bytes_per_token: int
) -> None:
    summary = read_gguf(VOCAB_DIR / name)
    shape = ModelShape.from_gguf_metadata(summary.metadata)
    assert (shape.architecture, shape.n_layers, shape.n_head_kv[0], shape.key_length) == (
        arch,
        layers,
        kv_heads,
        head,
    )
    assert shape.n_ctx_train == n_ctx_train
    assert kv_bytes_per_token(shape, CacheType.F16, CacheType.F16) == bytes_per_token
    assert shape.warnings == ()
    assert summary.tensor_count == 0
    assert summary.weights_bytes == summary.file_bytes


def test_gemma4_per_layer_heads_and_sliding_window() -> None:
    shape = ModelShape.from_gguf_metadata(read_gguf(VOCAB_DIR / "ggml-vocab-gemma-4.gguf").metadata)
    assert shape.n_head_kv == GEMMA4_KV_HEADS
    assert shape.swa_layers == GEMMA4_SWA
    assert (shape.key_length, shape.value_length, shape.key_length_swa, shape.value_length_swa) == (
        512,
        512,
        256,
        256,
    )
    assert shape.sliding_window == 1024
    assert shape.n_layers_with_kv == 30  # shared_kv_layers = 0
    full, swa = bytes_per_token_split(shape)
    assert (full, swa) == (5 * 2 * 512 * 2 * 2, 25 * 8 * 256 * 2 * 2)
    layout = llama_server_layout(shape, ServerFlags(ctx_size=0, n_parallel=4, unified=True))
    assert (layout.cells_full, layout.cells_swa, layout.n_ctx_slot) == (262144, 4608, 262144)


def _llama_metadata(**overrides: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "llama.embedding_length": 64,
        "llama.context_length": 4096,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
    }
    metadata.update(overrides)
    return {k: v for k, v in metadata.items() if v is not ...}


@pytest.mark.parametrize(
    "key", ["general.architecture", "llama.block_count", "llama.embedding_length", "llama.context_length"]
)
def test_missing_key_is_named(key: str) -> None:
    metadata = _llama_metadata()
    del metadata[key]
    with pytest.raises(MissingMetadataKey, match=f"'{key}'") as info:
        ModelShape.from_gguf_metadata(metadata)
    assert info.value.key == key


def test_missing_head_count_is_named_when_the_head_size_needs_it() -> None:
    metadata = _llama_metadata(**{"llama.attention.head_count": ...})
    with pytest.raises(MissingMetadataKey, match=r"'llama\.attention\.head_count'"):
        ModelShape.from_gguf_metadata(metadata)


def test_head_count_kv_defaults_to_head_count() -> None:
    shape = ModelShape.from_gguf_metadata(_llama_metadata(**{"llama.attention.head_count_kv": ...}))
    assert shape.n_head_kv == (4, 4)


def test_null_per_layer_array_asks_for_verbose() -> None:
    metadata = _llama_metadata(**{"llama.attention.head_count_kv": None, "tokenizer.ggml.tokens": None})
    assert per_layer_arrays_missing(metadata) == ["llama.attention.head_count_kv"]
    with pytest.raises(NullMetadataArray, match="verbose=true"):
        ModelShape.from_gguf_metadata(metadata)


def test_per_layer_array_of_wrong_length_is_refused() -> None:
    with pytest.raises(ShapeError, match="has 3 entries; expected 2"):
        ModelShape.from_gguf_metadata(_llama_metadata(**{"llama.attention.head_count_kv": [2, 2, 2]}))


@pytest.mark.parametrize("value", [-1, "eight", 2.5, True])
def test_nonsense_values_are_refused(value: object) -> None:
    with pytest.raises(ShapeError, match=r"llama\.block_count"):
        ModelShape.from_gguf_metadata(_llama_metadata(**{"llama.block_count": value}))


def test_unknown_architecture_uses_generic_formula_with_a_warning() -> None:
    metadata = {k.replace("llama.", "frobnicator."): v for k, v in _llama_metadata().items()}
    metadata["general.architecture"] = "frobnicator"
    shape = ModelShape.from_gguf_metadata(metadata)
    assert kv_bytes_per_token(shape) == 2 * 2 * 16 * 2 * 2
    assert len(shape.warnings) == 1
    assert "'frobnicator' is not known" in shape.warnings[0]
    assert "generic formula" in shape.warnings[0]


def test_gemma3_period_and_optional_window() -> None:
    base = {
        "general.architecture": "gemma3",
        "gemma3.block_count": 12,
        "gemma3.embedding_length": 1024,
        "gemma3.context_length": 32768,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
    }
    dense = ModelShape.from_gguf_metadata(base)
    assert not dense.has_swa
    shape = ModelShape.from_gguf_metadata({**base, "gemma3.attention.sliding_window": 512})
    assert shape.swa_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,)
    assert shape.sliding_window == 512


def test_gemma2_default_window_and_period() -> None:
    metadata = {
        "general.architecture": "gemma2",
        "gemma2.block_count": 4,
        "gemma2.embedding_length": 256,
        "gemma2.context_length": 8192,
        "gemma2.attention.head_count": 4,
        "gemma2.attention.head_count_kv": 2,
    }
    shape = ModelShape.from_gguf_metadata(metadata)
    assert shape.swa_layers == (True, False, True, False)
    assert shape.sliding_window == 4096


def test_cohere2_needs_its_window() -> None:
    metadata = {
        "general.architecture": "cohere2",
        "cohere2.block_count": 4,
        "cohere2.embedding_length": 256,
        "cohere2.context_length": 8192,
        "cohere2.attention.head_count": 4,
    }
    with pytest.raises(MissingMetadataKey, match=r"cohere2\.attention\.sliding_window"):
        ModelShape.from_gguf_metadata(metadata)


def test_phi3_sliding_window_is_ignored_like_llama_cpp() -> None:
    metadata = {
        "general.architecture": "phi3",
        "phi3.block_count": 2,
        "phi3.embedding_length": 3072,
        "phi3.context_length": 4096,
        "phi3.attention.head_count": 32,
        "phi3.attention.sliding_window": 2047,
    }
    assert not ModelShape.from_gguf_metadata(metadata).has_swa


def test_mla_and_recurrent_metadata() -> None:
    mla = ModelShape.from_gguf_metadata(
        {
            "general.architecture": "deepseek2",
            "deepseek2.block_count": 2,
            "deepseek2.embedding_length": 2048,
            "deepseek2.context_length": 163840,
            "deepseek2.attention.head_count": 16,
            "deepseek2.attention.head_count_kv": 1,
            "deepseek2.attention.key_length": 576,
            "deepseek2.attention.value_length": 512,
            "deepseek2.attention.key_length_mla": 192,
            "deepseek2.attention.value_length_mla": 128,
        }
    )
    assert mla.is_mla
    assert kv_bytes_per_token(mla) == 2 * 576 * 2
    mamba = ModelShape.from_gguf_metadata(
        {
            "general.architecture": "mamba",
            "mamba.block_count": 2,
            "mamba.embedding_length": 768,
            "mamba.context_length": 1048576,
            "mamba.attention.head_count": 0,
            "mamba.ssm.conv_kernel": 4,
            "mamba.ssm.inner_size": 1536,
            "mamba.ssm.state_size": 16,
        }
    )
    assert kv_bytes_per_token(mamba) == 0
    assert mamba.recurrent_state_bytes_per_seq == 2 * 4 * (3 * 1536 + 16 * 1536)
