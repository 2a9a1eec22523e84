"""GGUF key/values -> ModelShape, following llama.cpp's loader (src/llama-model.cpp ``load_hparams``).

The same keys come from a GGUF file on disk and from Ollama's ``/api/show`` ``model_info``. Per-layer
values (``head_count``, ``head_count_kv``) may be a scalar or an array; a ``null`` array (Ollama without
verbose) raises ``NullMetadataArray`` so the caller can ask again with ``verbose``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.memory.kv import MissingMetadataKey, ModelShape, NullMetadataArray, ShapeError


@dataclass(frozen=True)
class SwaRule:
    """How an architecture marks its sliding-window layers when the GGUF has no bool pattern."""

    period: (
        int  # layer il is SWA iff il % period < period - 1 (or != 0 when dense_first); 0 = bool array only
    )
    dense_first: bool = False
    default_window: int = 0  # used when <arch>.attention.sliding_window is absent
    window_required: bool = False  # llama.cpp refuses to load without <arch>.attention.sliding_window


# Architectures whose KV layout kvgate knows. Dense ones need no rule.
_DENSE_ARCHS = frozenset(
    {
        "llama",
        "deci",
        "qwen2",
        "qwen2moe",
        "qwen3",
        "qwen3moe",
        "mistral3",
        "gemma",
        "phi2",
        "phi3",
        "command-r",
        "gpt2",
        "gptneox",
        "falcon",
        "mpt",
        "starcoder",
        "starcoder2",
        "refact",
        "stablelm",
        "baichuan",
        "internlm2",
        "granite",
        "granitemoe",
        "olmo",
        "deepseek",
        "deepseek2",
        "chatglm",
        "glm4",
        "exaone",
        "smollm3",
        "seed_oss",
        "ernie4_5",
        "bloom",
        "orion",
        "minicpm",
        "mamba",
        "mamba2",
    }
)
_SWA_RULES: dict[str, SwaRule] = {
    "gemma2": SwaRule(period=2, default_window=4096),
    "gemma3": SwaRule(period=6),
    "gemma4": SwaRule(period=0, window_required=True),
    "cohere2": SwaRule(period=4, window_required=True),
    "gpt-oss": SwaRule(period=2, window_required=True),
}
_NO_SWA_ARCHS = frozenset({"phi3"})  # llama.cpp ignores phi3's sliding_window (conversion bug)
_NO_KV_ARCHS = frozenset(
    {
        "bert",
        "nomic-bert",
        "nomic-bert-moe",
        "jina-bert-v2",
        "jina-bert-v3",
        "modern-bert",
        "neo-bert",
        "eurobert",
        "gemma-embedding",
        "t5encoder",
    }
)
_RECURRENT_ARCHS = frozenset({"mamba", "mamba2"})
KNOWN_ARCHITECTURES = _DENSE_ARCHS | _SWA_RULES.keys() | _NO_SWA_ARCHS | _NO_KV_ARCHS


def _get(metadata: Mapping[str, Any], key: str) -> Any:
    if key not in metadata:
        raise MissingMetadataKey(key)
    value = metadata[key]
    if value is None:
        raise NullMetadataArray(key)
    return value


def _int(metadata: Mapping[str, Any], key: str, default: int | None = None) -> int:
    if key not in metadata and default is not None:
        return default
    value = _get(metadata, key)
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 0:
        raise ShapeError(f"metadata '{key}' is {value!r}; expected a non-negative integer")
    return int(value)


def _per_layer(
    metadata: Mapping[str, Any], key: str, n_layers: int, default: tuple[int, ...]
) -> tuple[int, ...]:
    if key not in metadata:
        return default
    value = _get(metadata, key)
    if isinstance(value, Sequence) and not isinstance(value, str):
        values = tuple(int(v) for v in value)
        if len(values) != n_layers:
            raise ShapeError(
                f"metadata '{key}' has {len(values)} entries; expected {n_layers} (one per layer)"
            )
        return values
    return (_int(metadata, key),) * n_layers


def per_layer_arrays_missing(metadata: Mapping[str, Any]) -> list[str]:
    """Keys whose value is null: Ollama /api/show must be asked again with verbose=true."""
    return [key for key, value in metadata.items() if value is None and not key.startswith("tokenizer.")]


def _swa_layers(
    metadata: Mapping[str, Any], arch: str, n_layers: int, rule: SwaRule | None
) -> tuple[tuple[bool, ...], int]:
    window_key = f"{arch}.attention.sliding_window"
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    if rule is None or arch in _NO_SWA_ARCHS:
        return (False,) * n_layers, 0
    needs_key = window_key in metadata or rule.window_required
    window = _int(metadata, window_key) if needs_key else rule.default_window
    if window == 0:
        return (False,) * n_layers, 0
    pattern = metadata.get(pattern_key)
    if pattern_key in metadata and pattern is None:
        raise NullMetadataArray(pattern_key)
    if isinstance(pattern, Sequence) and not isinstance(pattern, str):
        if len(pattern) != n_layers:
            raise ShapeError(f"metadata '{pattern_key}' has {len(pattern)} entries; expected {n_layers}")
        return tuple(bool(v) for v in pattern), window
    period = _int(metadata, pattern_key) if pattern_key in metadata else rule.period
    if period == 0 and rule.period == 0:
        raise MissingMetadataKey(pattern_key, "a bool array is required for this architecture")
    if period == 0:
        return (True,) * n_layers, window
    if rule.dense_first:
        return tuple(il % period != 0 for il in range(n_layers)), window
    return tuple(il % period < period - 1 for il in range(n_layers)), window


def _recurrent_state_bytes(metadata: Mapping[str, Any], arch: str, recurrent_layers: int) -> int:
    """Mamba-style f32 state per layer: conv (d_conv-1)*(d_inner+2*n_group*d_state) + ssm d_state*d_inner."""
    if recurrent_layers == 0 or f"{arch}.ssm.inner_size" not in metadata:
        return 0
    d_conv = _int(metadata, f"{arch}.ssm.conv_kernel")
    d_inner = _int(metadata, f"{arch}.ssm.inner_size")
    d_state = _int(metadata, f"{arch}.ssm.state_size")
    n_group = _int(metadata, f"{arch}.ssm.group_count", 0)
    n_embd_r = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    n_embd_s = d_state * d_inner
    return 4 * (n_embd_r + n_embd_s) * recurrent_layers


def shape_from_metadata(metadata: Mapping[str, Any]) -> ModelShape:
    """ModelShape from GGUF key/values; MissingMetadataKey names the first needed key that is absent."""
    arch = str(_get(metadata, "general.architecture"))
    n_layers = _int(metadata, f"{arch}.block_count")
    n_embd = _int(metadata, f"{arch}.embedding_length")
    n_ctx_train = _int(metadata, f"{arch}.context_length")
    n_head = _per_layer(metadata, f"{arch}.attention.head_count", n_layers, (0,) * n_layers)
    n_head_kv = _per_layer(metadata, f"{arch}.attention.head_count_kv", n_layers, n_head)
    head0 = n_head[0] if n_layers else 0
    default_head = n_embd // head0 if head0 else 0
    key_length = _int(metadata, f"{arch}.attention.key_length", default_head)
    value_length = _int(metadata, f"{arch}.attention.value_length", default_head)
    if (key_length == 0 or value_length == 0) and any(n_head_kv) and arch not in _NO_KV_ARCHS:
        raise MissingMetadataKey(f"{arch}.attention.head_count", "needed to derive the head size")
    key_length_swa = _int(metadata, f"{arch}.attention.key_length_swa", key_length)
    value_length_swa = _int(metadata, f"{arch}.attention.value_length_swa", value_length)
    rule = _SWA_RULES.get(arch)
    swa_layers, window = _swa_layers(metadata, arch, n_layers, rule)
    is_mla = bool(metadata.get(f"{arch}.attention.key_length_mla")) and bool(
        metadata.get(f"{arch}.attention.value_length_mla")
    )
    n_with_kv: int | None = None
    if arch in _NO_KV_ARCHS:
        n_with_kv = 0
    elif f"{arch}.attention.shared_kv_layers" in metadata:
        n_with_kv = n_layers - _int(metadata, f"{arch}.attention.shared_kv_layers")
    recurrent_layers = n_layers if arch in _RECURRENT_ARCHS else sum(1 for h in n_head_kv if h == 0)
    warnings: tuple[str, ...] = ()
    if arch not in KNOWN_ARCHITECTURES:
        warnings = (
            f"architecture '{arch}' is not known to kvgate; its KV size uses the generic formula "
            "(every layer, head_count_kv x (key_length + value_length), full context) and may be wrong",
        )
        if f"{arch}.attention.sliding_window" in metadata:
            warnings += (f"'{arch}' has a sliding window that the generic formula ignores (over-estimate)",)
    return ModelShape(
        architecture=arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        key_length=key_length,
        value_length=value_length,
        key_length_swa=key_length_swa,
        value_length_swa=value_length_swa,
        swa_layers=swa_layers,
        sliding_window=window,
        n_ctx_train=n_ctx_train,
        is_mla=is_mla,
        recurrent_state_bytes_per_seq=_recurrent_state_bytes(metadata, arch, recurrent_layers),
        n_layers_with_kv=n_with_kv,
        warnings=warnings,
    )
