"""Built-in model profiles, for `kvgate estimate` without a backend or a file.

Hyper-parameters are the models' published configurations (config.json / GGUF metadata). Weight sizes are the
GGUF file sizes of the common community conversions (bartowski / Ollama library), in bytes, rounded to the MB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.memory.kv import ModelShape
from gateway.memory.profile import ModelProfile, ProfileSource

MB = 1_000_000


@dataclass(frozen=True)
class Preset:
    architecture: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int
    n_ff: int
    n_vocab: int
    parameter_count: int
    weights_mb: dict[str, int]  # quantization -> GGUF size in MB
    sliding_window: int = 0
    swa_period: int = 0  # every period-th layer is global, the rest slide


PRESETS: dict[str, Preset] = {
    "llama3.1:8b": Preset(
        "llama", 32, 4096, 32, 8, 128, 131072, 14336, 128256, 8_030_000_000,
        {"Q4_K_M": 4_920, "Q8_0": 8_540, "F16": 16_070},
    ),
    "llama3.1:70b": Preset(
        "llama", 80, 8192, 64, 8, 128, 131072, 28672, 128256, 70_550_000_000,
        {"Q4_K_M": 42_520, "Q8_0": 74_980, "F16": 141_110},
    ),
    "qwen2.5:7b": Preset(
        "qwen2", 28, 3584, 28, 4, 128, 32768, 18944, 152064, 7_620_000_000,
        {"Q4_K_M": 4_680, "Q8_0": 8_100, "F16": 15_240},
    ),
    "qwen2.5:32b": Preset(
        "qwen2", 64, 5120, 40, 8, 128, 32768, 27648, 152064, 32_760_000_000,
        {"Q4_K_M": 19_850, "Q8_0": 34_820, "F16": 65_540},
    ),
    "gemma3:12b": Preset(
        "gemma3", 48, 3840, 16, 8, 256, 131072, 15360, 262208, 11_770_000_000,
        {"Q4_K_M": 7_300, "Q8_0": 12_510, "F16": 23_540},
        sliding_window=1024, swa_period=6,
    ),
    "gemma3:27b": Preset(
        "gemma3", 62, 5376, 32, 16, 128, 131072, 21504, 262208, 27_010_000_000,
        {"Q4_K_M": 16_550, "Q8_0": 28_710, "F16": 54_030},
        sliding_window=1024, swa_period=6,
    ),
    "mistral-nemo:12b": Preset(
        "llama", 40, 5120, 32, 8, 128, 1024000, 14336, 131072, 12_250_000_000,
        {"Q4_K_M": 7_480, "Q8_0": 13_020, "F16": 24_500},
    ),
    "phi3:mini": Preset(
        "phi3", 32, 3072, 32, 32, 96, 4096, 8192, 32064, 3_820_000_000,
        {"Q4_K_M": 2_390, "Q8_0": 4_060, "F16": 7_640},
    ),
}

ALIASES: dict[str, str] = {
    "llama-3.1-8b": "llama3.1:8b",
    "llama-3.1-70b": "llama3.1:70b",
    "qwen2.5-7b": "qwen2.5:7b",
    "qwen2.5-32b": "qwen2.5:32b",
    "gemma-3-12b": "gemma3:12b",
    "gemma-3-27b": "gemma3:27b",
    "mistral-nemo": "mistral-nemo:12b",
    "mistral-nemo-12b": "mistral-nemo:12b",
    "phi-3-mini": "phi3:mini",
    "phi3": "phi3:mini",
}
DEFAULT_QUANTIZATION = "Q4_K_M"


def preset_shape(preset: Preset) -> ModelShape:
    layers = preset.n_layers
    period = preset.swa_period
    swa = tuple(period > 0 and il % period < period - 1 for il in range(layers))
    return ModelShape(
        architecture=preset.architecture,
        n_layers=layers,
        n_embd=preset.n_embd,
        n_head=(preset.n_head,) * layers,
        n_head_kv=(preset.n_head_kv,) * layers,
        key_length=preset.head_dim,
        value_length=preset.head_dim,
        key_length_swa=preset.head_dim,
        value_length_swa=preset.head_dim,
        swa_layers=swa,
        sliding_window=preset.sliding_window,
        n_ctx_train=preset.n_ctx_train,
    )


_QUANT_SUFFIX = re.compile(r"[-@/](q4_k_m|q8_0|f16)$")


def find_preset(name: str) -> tuple[str, str] | None:
    """(preset key, quantization) for 'llama3.1:8b', 'llama3.1:8b-q8_0', 'Llama-3.1-8B'; None if unknown."""
    lowered = name.strip().lower()
    quant = DEFAULT_QUANTIZATION
    match = _QUANT_SUFFIX.search(lowered)
    if match:
        quant = match.group(1).upper()
        lowered = lowered[: match.start()]
    key = ALIASES.get(lowered, lowered)
    return (key, quant) if key in PRESETS else None


def preset_names() -> list[str]:
    return sorted(PRESETS)


def preset_profile(name: str, quantization: str | None = None) -> ModelProfile:
    """The built-in profile; ValueError listing the presets when the name is unknown."""
    found = find_preset(name)
    if found is None:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    key, quant = found
    preset = PRESETS[key]
    quant = (quantization or quant).upper()
    if quant not in preset.weights_mb:
        raise ValueError(f"preset {key} has no {quant!r} weights; allowed: {', '.join(preset.weights_mb)}")
    return ModelProfile(
        name=key,
        shape=preset_shape(preset),
        weights_bytes=preset.weights_mb[quant] * MB,
        source=ProfileSource.PRESET,
        quantization=quant,
        parameter_count=preset.parameter_count,
        n_vocab=preset.n_vocab,
        n_ff=preset.n_ff,
        capabilities=("completion",),
        cache_key=f"preset:{key}:{quant}",
    )
