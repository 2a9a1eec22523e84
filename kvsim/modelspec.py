"""One model as the simulator knows it: hyper-parameters, tensors, tokenizer, and its GGUF key/values.

``model_info`` is ``/api/show``'s map (the GGUF key/values, arrays null unless verbose): what a client (the
gateway) reads to size the KV cache; ``kvsim.gpu.kv_cache.AttentionLayers.of`` is the same model as the simulated
runtimes allocate it. Pure data.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from kvsim.gpu.weights import (
    Architecture,
    FileType,
    WeightBytes,
    layer_weight_bytes,
    tensor_type,
    tensors,
    weight_bytes,
)

_HEADER_BYTES = 4 * 1024 * 1024  # key/values + tensor infos outside the tokenizer arrays (approximate)


@dataclass(frozen=True)
class ModelSpec:
    """One model as ``ollama list`` would show it."""

    name: str  # "llama3.1:8b"
    gguf_arch: str  # general.architecture
    family: str
    arch: Architecture
    file_type: FileType
    n_ctx_train: int
    rope_freq_base: float
    rms_eps: float
    template: str  # a kvsim.templates renderer name
    capabilities: tuple[str, ...]
    tokenizer_model: str  # tokenizer.ggml.model
    tokenizer_pre: str | None
    bos_id: int
    eos_id: int
    add_bos: bool
    vocab: str | None = None  # gateway/data/vocab/ggml-vocab-<vocab>.gguf
    sliding_window: int = 0
    swa_period: int = 0  # layer il slides iff il % period < period - 1
    stop: tuple[str, ...] = ()
    num_ctx_param: int | None = None  # a Modelfile PARAMETER num_ctx
    basename: str = ""
    license_name: str = ""

    @cached_property
    def weights(self) -> WeightBytes:
        return weight_bytes(self.arch, self.file_type)

    @cached_property
    def layer_weights(self) -> tuple[int, ...]:
        """Weight bytes of each repeating layer (what a partial offload moves to the CPU, layer by layer)."""
        return layer_weight_bytes(self.arch, self.file_type)

    @property
    def file_bytes(self) -> int:
        """Approximate GGUF file size: tensor data plus metadata (the tokenizer arrays dominate)."""
        return self.weights.tensor_bytes + _HEADER_BYTES

    @property
    def digest(self) -> str:
        """A stable stand-in for the blob digest (sha256 of the name and file type)."""
        return hashlib.sha256(f"{self.name}/{self.file_type.label}".encode()).hexdigest()

    @property
    def parameter_size(self) -> str:
        return human_number(self.weights.parameter_count)

    @property
    def is_embedding(self) -> bool:
        return "completion" not in self.capabilities

    @property
    def swa_layers(self) -> tuple[bool, ...]:
        if not self.sliding_window or not self.swa_period:
            return (False,) * self.arch.n_layers
        p = self.swa_period
        return tuple(il % p < p - 1 for il in range(self.arch.n_layers))

    def with_file_type(self, name: str, file_type: FileType) -> ModelSpec:
        return replace(self, name=name, file_type=file_type)


def tensor_list(spec: ModelSpec) -> list[dict[str, Any]]:
    """``/api/show`` ``tensors``: every tensor's name, ggml type and shape (ggml order), as Ollama lists them for a
    GGUF model (``api.Tensor``)."""
    return [{"name": t.name, "type": tensor_type(spec.arch, t, spec.file_type), "shape": list(t.shape)}
            for t in tensors(spec.arch)]


def human_number(count: int) -> str:
    """Ollama's ``format.HumanNumber`` (the ``parameter_size`` label)."""
    for unit, size, decimals in (("B", 10**9, 1), ("M", 10**6, 2)):
        if count >= size:
            number = count / size
            if number == int(number):
                return f"{int(number)}{unit}"
            return f"{number:.{decimals}f}{unit}"
    if count >= 1000:
        return f"{count / 1000:.0f}K"
    return str(count)


def model_info(spec: ModelSpec, *, arrays: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """``/api/show`` ``model_info``: the GGUF key/values (``general.name`` and the chat template removed).

    Without ``arrays`` (``verbose: false``) every GGUF array is JSON ``null``, as Ollama returns it.
    """
    a, arch = spec.arch, spec.gguf_arch
    info: dict[str, Any] = {
        "general.architecture": arch,
        "general.basename": spec.basename,
        "general.file_type": int(spec.file_type),
        "general.license": spec.license_name,
        "general.parameter_count": spec.weights.parameter_count,
        "general.quantization_version": 2,
        "general.type": "model",
        f"{arch}.block_count": a.n_layers,
        f"{arch}.context_length": spec.n_ctx_train,
        f"{arch}.embedding_length": a.n_embd,
        f"{arch}.feed_forward_length": a.n_ff,
        f"{arch}.attention.head_count": a.n_head,
        f"{arch}.attention.head_count_kv": a.n_head_kv,
        "tokenizer.ggml.model": spec.tokenizer_model,
        "tokenizer.ggml.bos_token_id": spec.bos_id,
        "tokenizer.ggml.eos_token_id": spec.eos_id,
        "tokenizer.ggml.add_bos_token": spec.add_bos,
        "tokenizer.ggml.tokens": None,
        "tokenizer.ggml.token_type": None,
    }
    if a.n_embd // a.n_head != a.head_dim:
        info[f"{arch}.attention.key_length"] = a.head_dim
        info[f"{arch}.attention.value_length"] = a.head_dim
    if spec.tokenizer_pre is not None:
        info["tokenizer.ggml.pre"] = spec.tokenizer_pre
    if spec.tokenizer_model == "gpt2":
        info["tokenizer.ggml.merges"] = None
    else:
        info["tokenizer.ggml.scores"] = None
    if spec.gguf_arch == "nomic-bert":
        info[f"{arch}.pooling_type"] = 1
        info[f"{arch}.attention.layer_norm_epsilon"] = spec.rms_eps
    else:
        info[f"{arch}.attention.layer_norm_rms_epsilon"] = spec.rms_eps
        info[f"{arch}.rope.freq_base"] = spec.rope_freq_base
        info[f"{arch}.vocab_size"] = a.n_vocab
    if spec.sliding_window:
        info[f"{arch}.attention.sliding_window"] = spec.sliding_window
    for key, values in (arrays or {}).items():
        info[key] = values
    return dict(sorted(info.items()))
