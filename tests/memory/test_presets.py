"""Built-in presets: published hyper-parameters give these bytes per token."""

from __future__ import annotations

import pytest

from gateway.memory.kv import CacheType, bytes_per_token_split, kv_bytes_per_token
from gateway.memory.presets import find_preset, preset_names, preset_profile


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "head", "n_ctx_train", "f16_bytes_per_token"),
    [
        ("llama3.1:8b", 32, 8, 128, 131072, 131072),
        ("llama3.1:70b", 80, 8, 128, 131072, 327680),
        ("qwen2.5:7b", 28, 4, 128, 32768, 57344),
        ("qwen2.5:32b", 64, 8, 128, 32768, 262144),
        ("gemma3:12b", 48, 8, 256, 131072, 393216),
        ("gemma3:27b", 62, 16, 128, 131072, 507904),
        ("mistral-nemo:12b", 40, 8, 128, 1024000, 163840),
        ("phi3:mini", 32, 32, 96, 4096, 393216),
    ],
)
def test_preset_shapes(
    name: str, layers: int, kv_heads: int, head: int, n_ctx_train: int, f16_bytes_per_token: int
) -> None:
    shape = preset_profile(name).shape
    assert (shape.n_layers, shape.n_head_kv[0], shape.key_length, shape.n_ctx_train) == (
        layers, kv_heads, head, n_ctx_train
    )
    assert kv_bytes_per_token(shape, CacheType.F16, CacheType.F16) == f16_bytes_per_token


def test_gemma3_has_five_sliding_layers_per_global_layer() -> None:
    shape = preset_profile("gemma3:12b").shape
    assert shape.sliding_window == 1024
    assert shape.swa_layers[:12] == (True,) * 5 + (False,) + (True,) * 5 + (False,)
    full, swa = bytes_per_token_split(shape)
    assert (full, swa) == (8 * 8 * 256 * 4, 40 * 8 * 256 * 4)


def test_mistral_nemo_head_is_not_embd_over_heads() -> None:
    shape = preset_profile("mistral-nemo:12b").shape
    assert shape.n_embd // shape.n_head[0] == 160
    assert shape.key_length == 128


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("llama3.1:8b", ("llama3.1:8b", "Q4_K_M")),
        ("Llama-3.1-8B", ("llama3.1:8b", "Q4_K_M")),
        ("llama3.1:8b-q8_0", ("llama3.1:8b", "Q8_0")),
        ("gemma-3-27b@f16", ("gemma3:27b", "F16")),
        ("phi3", ("phi3:mini", "Q4_K_M")),
        ("gpt-5", None),
    ],
)
def test_find_preset(text: str, found: tuple[str, str] | None) -> None:
    assert find_preset(text) == found


def test_weights_by_quantization() -> None:
    sizes = [preset_profile("llama3.1:8b", q).weights_bytes for q in ("Q4_K_M", "Q8_0", "F16")]
    assert sizes == sorted(sizes)
    assert 4.5e9 < sizes[0] < 5.5e9 and 15e9 < sizes[2] < 17e9


def test_unknown_preset_and_quantization_list_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="presets: gemma3:12b"):
        preset_profile("gpt-5")
    with pytest.raises(ValueError, match="allowed: Q4_K_M, Q8_0, F16"):
        preset_profile("llama3.1:8b", "Q2_K")
    assert len(preset_names()) == 8
