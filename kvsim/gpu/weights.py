"""Weight bytes of a GGUF model, tensor by tensor, as llama.cpp's quantizer lays them out.

A model's weights are a list of tensors (``token_embd``, per-layer ``attn_q`` ... ``ffn_down``, norms). Each 2-D
tensor gets a ggml type chosen from the file type by llama.cpp's mixing rules (``llama_tensor_get_type``; only
the rules for the file types the simulator offers are kept); 1-D tensors (norms, biases) stay f32::

    Q4_K_M   output (or the tied token_embd) Q6_K; attn_qkv Q5_K; attn_v and ffn_down Q6_K on the
             "more bits" layers (first and last eighth, every third between), else Q4_K (Q5_K for attn_v of
             70B models); everything else Q4_K
    Q4_0     output (or the tied token_embd) Q6_K; everything else Q4_0
    Q8_0     everything Q8_0
    F16      everything F16

The result reproduces llama.cpp's load log, e.g. Llama 3.1 8B Q4_K_M ``CUDA0 model buffer size = 4403.49 MiB``
and ``CPU_Mapped model buffer size = 281.81 MiB`` (token_embd stays in host memory; a tied output layer gets its
own copy on the GPU). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

# ggml type -> (values per block, bytes per block); ggml/src/ggml.c type_traits
_TYPE_BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
# k-quants need rows of whole 256-value blocks; llama.cpp falls back to these otherwise
_K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


class FileType(IntEnum):
    """``general.file_type`` values (llama.cpp ``llama_ftype``) and Ollama's ``quantization_level`` names."""

    F16 = 1
    Q4_0 = 2
    Q8_0 = 7
    Q4_K_M = 15

    @property
    def label(self) -> str:
        return self.name


@dataclass(frozen=True)
class Architecture:
    """The hyper-parameters that decide which tensors a model has and how large they are."""

    kind: str  # "llama" (also qwen2, mistral), "gemma3", "phi3", "nomic-bert"
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    rope_freqs: int = 0  # llama 3.1 stores its rope scaling factors as a small f32 tensor
    size_70b: bool = False  # llama.cpp's LLM_TYPE_70B rule for attn_v


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    role: str
    layer: int = -1

    @property
    def n_values(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


def _layer_tensors(arch: Architecture, il: int) -> Iterator[Tensor]:
    e, q_dim, kv_dim = arch.n_embd, arch.n_head * arch.head_dim, arch.n_head_kv * arch.head_dim
    p = f"blk.{il}."
    if arch.kind == "nomic-bert":  # post-norm BERT: its norms carry biases and follow each block
        yield from _bert_layer(arch, il)
        return
    yield Tensor(p + "attn_norm.weight", (e,), "norm", il)
    if arch.kind in ("phi3", "nomic-bert"):
        yield Tensor(p + "attn_qkv.weight", (e, q_dim + 2 * kv_dim), "attn_qkv", il)
    else:
        yield Tensor(p + "attn_q.weight", (e, q_dim), "attn_q", il)
        yield Tensor(p + "attn_k.weight", (e, kv_dim), "attn_k", il)
        yield Tensor(p + "attn_v.weight", (e, kv_dim), "attn_v", il)
    if arch.qkv_bias:
        for part, dim in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
            yield Tensor(p + f"attn_{part}.bias", (dim,), "bias", il)
    if arch.kind == "gemma3":
        yield Tensor(p + "attn_q_norm.weight", (arch.head_dim,), "norm", il)
        yield Tensor(p + "attn_k_norm.weight", (arch.head_dim,), "norm", il)
        yield Tensor(p + "post_attention_norm.weight", (e,), "norm", il)
        yield Tensor(p + "post_ffw_norm.weight", (e,), "norm", il)
    yield Tensor(p + "attn_output.weight", (q_dim, e), "attn_output", il)
    yield Tensor(p + "ffn_norm.weight", (e,), "norm", il)
    if arch.kind == "phi3":
        yield Tensor(p + "ffn_up.weight", (e, 2 * arch.n_ff), "ffn_up", il)
    else:
        yield Tensor(p + "ffn_gate.weight", (e, arch.n_ff), "ffn_gate", il)
        yield Tensor(p + "ffn_up.weight", (e, arch.n_ff), "ffn_up", il)
    yield Tensor(p + "ffn_down.weight", (arch.n_ff, e), "ffn_down", il)


def _bert_layer(arch: Architecture, il: int) -> Iterator[Tensor]:
    e, p = arch.n_embd, f"blk.{il}."
    yield Tensor(p + "attn_qkv.weight", (e, 3 * e), "attn_qkv", il)
    yield Tensor(p + "attn_output.weight", (e, e), "attn_output", il)
    yield Tensor(p + "attn_output_norm.weight", (e,), "norm", il)
    yield Tensor(p + "attn_output_norm.bias", (e,), "norm", il)
    yield Tensor(p + "ffn_up.weight", (e, arch.n_ff), "ffn_up", il)
    yield Tensor(p + "ffn_gate.weight", (e, arch.n_ff), "ffn_gate", il)
    yield Tensor(p + "ffn_down.weight", (arch.n_ff, e), "ffn_down", il)
    yield Tensor(p + "layer_output_norm.weight", (e,), "norm", il)
    yield Tensor(p + "layer_output_norm.bias", (e,), "norm", il)


def tensors(arch: Architecture) -> list[Tensor]:
    """Every tensor of the model, in file order."""
    out = [Tensor("token_embd.weight", (arch.n_embd, arch.n_vocab), "token_embd")]
    if arch.kind == "nomic-bert":
        out.append(Tensor("token_types.weight", (arch.n_embd, 2), "input"))
        out.append(Tensor("token_embd_norm.weight", (arch.n_embd,), "input"))
        out.append(Tensor("token_embd_norm.bias", (arch.n_embd,), "input"))
    if arch.rope_freqs:
        out.append(Tensor("rope_freqs.weight", (arch.rope_freqs,), "norm"))
    for il in range(arch.n_layers):
        out.extend(_layer_tensors(arch, il))
    if arch.kind != "nomic-bert":
        out.append(Tensor("output_norm.weight", (arch.n_embd,), "norm"))
        if not arch.tied_embeddings:
            out.append(Tensor("output.weight", (arch.n_embd, arch.n_vocab), "output"))
    return out


def _more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp ``use_more_bits``: the first and last eighth of the layers, and every third one between."""
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


def _k_quant_type(arch: Architecture, tensor: Tensor, as_output: bool) -> str:
    if as_output:
        return "Q6_K"
    if tensor.role == "attn_qkv":
        return "Q5_K"
    if tensor.role == "attn_v":
        if _more_bits(tensor.layer, arch.n_layers):
            return "Q6_K"
        return "Q5_K" if arch.size_70b else "Q4_K"
    if tensor.role == "ffn_down" and _more_bits(tensor.layer, arch.n_layers):
        return "Q6_K"
    return "Q4_K"


def tensor_type(arch: Architecture, tensor: Tensor, file_type: FileType) -> str:
    """The ggml type llama.cpp's quantizer gives ``tensor`` in a file of ``file_type``."""
    if len(tensor.shape) == 1 or tensor.role == "input":
        return "F32"
    if file_type is FileType.F16:
        return "F16"
    if file_type is FileType.Q8_0:
        return "Q8_0"
    as_output = tensor.role == "output" or (tensor.role == "token_embd" and arch.tied_embeddings)
    q4_0 = "Q6_K" if as_output else "Q4_0"
    chosen = q4_0 if file_type is FileType.Q4_0 else _k_quant_type(arch, tensor, as_output)
    if chosen in _K_FALLBACK and tensor.shape[0] % 256:
        return _K_FALLBACK[chosen]
    return chosen


def tensor_bytes(ggml_type: str, n_values: int) -> int:
    per_block, block_bytes = _TYPE_BLOCKS[ggml_type]
    return n_values // per_block * block_bytes


@dataclass(frozen=True)
class WeightBytes:
    """Where the weights go when every layer is offloaded."""

    gpu_bytes: int  # every tensor but the input embeddings, plus a GPU copy of a tied output layer
    host_bytes: int  # token embeddings (and BERT's input tensors) stay in host memory
    tensor_bytes: int  # the tensor data in the file
    parameter_count: int  # general.parameter_count: the sum of all tensor elements


def weight_bytes(arch: Architecture, file_type: FileType) -> WeightBytes:
    gpu = host = params = tied_copy = 0
    for t in tensors(arch):
        size = tensor_bytes(tensor_type(arch, t, file_type), t.n_values)
        params += t.n_values
        if t.role in ("token_embd", "input"):
            host += size
            if t.role == "token_embd" and arch.tied_embeddings:
                tied_copy = size
        else:
            gpu += size
    return WeightBytes(gpu_bytes=gpu + tied_copy, host_bytes=host, tensor_bytes=gpu + host, parameter_count=params)


def layer_weight_bytes(arch: Architecture, file_type: FileType) -> tuple[int, ...]:
    """The weights of each repeating layer (``blk.<il>.*``), in layer order: what moves to the CPU with the layer
    when llama.cpp offloads only some layers. The rest of ``WeightBytes.gpu_bytes`` (output layer, output norm,
    rope factors, a tied output copy) belongs to no layer."""
    out = [0] * arch.n_layers
    for t in tensors(arch):
        if t.layer >= 0:
            out[t.layer] += tensor_bytes(tensor_type(arch, t, file_type), t.n_values)
    return tuple(out)
