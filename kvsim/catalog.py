"""The models the simulator serves: true hyper-parameters, tensor layouts and tokenizers of real models.

Each entry is what the model's GGUF says (``general.architecture``, ``<arch>.block_count`` ...), checked against
the published configs; weight bytes come from ``weights`` (the tensor list under llama.cpp's quantization mix),
which reproduces the sizes Ollama's library lists (llama3.1:8b 4.9 GB, qwen2.5:7b 4.7 GB, phi3:mini 2.2 GB,
mistral-nemo 7.1 GB, nomic-embed-text 274 MB). ``gemma3`` entries count the text weights only (Ollama's
``gemma3`` blobs add a ~0.4B-parameter vision tower, which is why it lists 12.2B).

A model whose tokenizer is in ``gateway/data/vocab`` names that file (``vocab``); the others (Gemma 3, Mistral
Nemo, nomic-embed-text) use the deterministic stand-in tokenizer of ``kvsim.vocab``. Pure data.
"""

from __future__ import annotations

from dataclasses import replace

from kvsim.gpu.weights import Architecture, FileType
from kvsim.modelspec import ModelSpec, human_number, model_info

__all__ = ["CATALOG", "DEFAULT_MODELS", "ModelSpec", "canonical_name", "human_number", "lookup", "model_info", "select"]

_LLAMA31 = ModelSpec(
    name="llama3.1:8b",
    gguf_arch="llama",
    family="llama",
    arch=Architecture("llama", 32, 4096, 32, 8, 128, 14336, 128256, rope_freqs=64),
    file_type=FileType.Q4_K_M,
    n_ctx_train=131072,
    rope_freq_base=500000.0,
    rms_eps=1e-05,
    template="llama3",
    capabilities=("completion", "tools"),
    tokenizer_model="gpt2",
    tokenizer_pre="llama-bpe",
    bos_id=128000,
    eos_id=128009,
    add_bos=True,
    vocab="llama-bpe",
    stop=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    basename="Meta-Llama-3.1",
    license_name="llama3.1",
)
_QWEN25 = ModelSpec(
    name="qwen2.5:7b",
    gguf_arch="qwen2",
    family="qwen2",
    arch=Architecture("llama", 28, 3584, 28, 4, 128, 18944, 152064, qkv_bias=True),
    file_type=FileType.Q4_K_M,
    n_ctx_train=32768,
    rope_freq_base=1000000.0,
    rms_eps=1e-06,
    template="qwen2",
    capabilities=("completion", "tools"),
    tokenizer_model="gpt2",
    tokenizer_pre="qwen2",
    bos_id=151643,
    eos_id=151645,
    add_bos=False,
    vocab="qwen2",
    stop=("<|im_start|>", "<|im_end|>"),
    basename="Qwen2.5",
    license_name="apache-2.0",
)
_GEMMA3 = ModelSpec(
    name="gemma3:12b",
    gguf_arch="gemma3",
    family="gemma3",
    arch=Architecture("gemma3", 48, 3840, 16, 8, 256, 15360, 262208, tied_embeddings=True),
    file_type=FileType.Q4_K_M,
    n_ctx_train=131072,
    rope_freq_base=1000000.0,
    rms_eps=1e-06,
    template="gemma3",
    capabilities=("completion", "vision"),
    tokenizer_model="llama",
    tokenizer_pre="default",
    bos_id=2,
    eos_id=1,
    add_bos=True,
    sliding_window=1024,
    swa_period=6,
    stop=("<end_of_turn>",),
    basename="gemma-3",
    license_name="gemma",
)
_NEMO = ModelSpec(
    name="mistral-nemo:12b",
    gguf_arch="llama",
    family="llama",
    arch=Architecture("llama", 40, 5120, 32, 8, 128, 14336, 131072),
    file_type=FileType.Q4_0,
    n_ctx_train=1024000,
    rope_freq_base=1000000.0,
    rms_eps=1e-05,
    template="mistral",
    capabilities=("completion", "tools"),
    tokenizer_model="gpt2",
    tokenizer_pre="tekken",
    bos_id=1,
    eos_id=2,
    add_bos=True,
    stop=("[INST]", "[/INST]"),
    basename="Mistral-Nemo",
    license_name="apache-2.0",
)
_PHI3 = ModelSpec(
    name="phi3:mini",
    gguf_arch="phi3",
    family="phi3",
    arch=Architecture("phi3", 32, 3072, 32, 32, 96, 8192, 32064),
    file_type=FileType.Q4_0,
    n_ctx_train=4096,
    rope_freq_base=10000.0,
    rms_eps=1e-05,
    template="phi3",
    capabilities=("completion",),
    tokenizer_model="llama",
    tokenizer_pre="default",
    bos_id=1,
    eos_id=32000,
    add_bos=True,
    vocab="phi-3",
    stop=("<|end|>", "<|user|>", "<|assistant|>"),
    basename="Phi-3",
    license_name="mit",
)
_NOMIC = ModelSpec(
    name="nomic-embed-text:latest",
    gguf_arch="nomic-bert",
    family="nomic-bert",
    arch=Architecture("nomic-bert", 12, 768, 12, 12, 64, 3072, 30522),
    file_type=FileType.F16,
    n_ctx_train=2048,
    rope_freq_base=1000.0,
    rms_eps=1e-12,
    template="none",
    capabilities=("embedding",),
    tokenizer_model="bert",
    tokenizer_pre=None,
    bos_id=101,
    eos_id=102,
    add_bos=True,
    num_ctx_param=8192,
    basename="nomic-embed-text",
    license_name="apache-2.0",
)

_BASE = (
    _LLAMA31,
    replace(
        _LLAMA31,
        name="llama3.1:70b",
        arch=Architecture("llama", 80, 8192, 64, 8, 128, 28672, 128256, rope_freqs=64, size_70b=True),
    ),
    _QWEN25,
    replace(
        _QWEN25,
        name="qwen2.5:32b",
        arch=Architecture("llama", 64, 5120, 40, 8, 128, 27648, 152064, qkv_bias=True),
    ),
    _GEMMA3,
    replace(
        _GEMMA3,
        name="gemma3:27b",
        arch=Architecture("gemma3", 62, 5376, 32, 16, 128, 21504, 262208, tied_embeddings=True),
    ),
    _NEMO,
    _PHI3,
    _NOMIC,
)
_VARIANTS = (
    _LLAMA31.with_file_type("llama3.1:8b-instruct-q8_0", FileType.Q8_0),
    _LLAMA31.with_file_type("llama3.1:8b-instruct-fp16", FileType.F16),
    _QWEN25.with_file_type("qwen2.5:7b-instruct-q8_0", FileType.Q8_0),
    _PHI3.with_file_type("phi3:3.8b-mini-4k-instruct-q4_K_M", FileType.Q4_K_M),
)

CATALOG: dict[str, ModelSpec] = {spec.name: spec for spec in (*_BASE, *_VARIANTS)}
DEFAULT_MODELS = ("llama3.1:8b", "qwen2.5:7b", "gemma3:12b", "mistral-nemo:12b", "phi3:mini", "nomic-embed-text")


def canonical_name(name: str) -> str:
    """Ollama's name normalization: a missing tag means ``:latest``."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def lookup(models: dict[str, ModelSpec], name: str) -> ModelSpec | None:
    return models.get(canonical_name(name.strip()))


def select(names: tuple[str, ...]) -> dict[str, ModelSpec]:
    """The catalog entries for ``names`` (KeyError names the unknown one and the choices)."""
    chosen: dict[str, ModelSpec] = {}
    for name in names:
        spec = CATALOG.get(canonical_name(name))
        if spec is None:
            raise KeyError(f"unknown model {name!r}; the catalog has: {', '.join(sorted(CATALOG))}")
        chosen[spec.name] = spec
    return chosen
