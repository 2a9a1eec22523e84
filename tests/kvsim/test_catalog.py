"""The catalog's models against their real numbers: llama.cpp load logs, published sizes, kv-memory.md."""

from __future__ import annotations

import pytest

from gateway.memory.kv import CacheType, kv_bytes_per_token, ollama_kv_cache_bytes
from gateway.memory.metadata import shape_from_metadata
from gateway.memory.presets import PRESETS
from kvsim.catalog import CATALOG, DEFAULT_MODELS, human_number, model_info, select
from kvsim.gpu.weights import FileType, tensor_type, tensors
from kvsim.vocab import tokenizer_for
from tests.kvsim.helpers import gateway_shape

MIB = 2**20
GB = 10**9


@pytest.mark.parametrize(
    ("name", "gpu_mib", "host_mib"),
    [
        # llama.cpp: "CUDA0 model buffer size = 4403.49 MiB", "CPU_Mapped model buffer size = 281.81 MiB"
        ("llama3.1:8b", 4403.49, 281.81),
        ("llama3.1:8b-instruct-q8_0", 7605.33, 532.31),
        ("llama3.1:8b-instruct-fp16", 14315.02, 1002.00),
        ("qwen2.5:7b", 4168.09, 292.36),
    ],
)
def test_weight_buffers_match_llama_cpp_load_logs(name: str, gpu_mib: float, host_mib: float) -> None:
    weights = CATALOG[name].weights
    assert round(weights.gpu_bytes / MIB, 2) == gpu_mib
    assert round(weights.host_bytes / MIB, 2) == host_mib


def test_llama_70b_total_matches_its_cpu_load_log() -> None:
    weights = CATALOG["llama3.1:70b"].weights  # "CPU buffer size = 40543.11 MiB" when loaded without a GPU
    assert round(weights.tensor_bytes / MIB, 2) == 40543.11


@pytest.mark.parametrize(
    ("name", "published_gb"),
    [
        ("llama3.1:8b", 4.9),  # ollama.com/library sizes, rounded to 0.1 GB
        ("qwen2.5:7b", 4.7),
        ("phi3:mini", 2.2),
        ("mistral-nemo:12b", 7.1),
        ("llama3.1:70b", 42.5),
        ("phi3:3.8b-mini-4k-instruct-q4_K_M", 2.4),
    ],
)
def test_file_sizes_match_published_sizes(name: str, published_gb: float) -> None:
    assert abs(CATALOG[name].file_bytes / GB - published_gb) < 0.06


@pytest.mark.parametrize(
    ("name", "label", "count"),
    [
        ("llama3.1:8b", "8.0B", 8_030_261_312),
        ("llama3.1:70b", "70.6B", 70_553_706_560),
        ("qwen2.5:7b", "7.6B", 7_615_616_512),
        ("mistral-nemo:12b", "12.2B", 12_247_782_400),
        ("phi3:mini", "3.8B", 3_821_079_552),
    ],
)
def test_parameter_counts(name: str, label: str, count: int) -> None:
    spec = CATALOG[name]
    assert spec.weights.parameter_count == count
    assert spec.parameter_size == label


def test_human_number_is_ollamas() -> None:
    assert [human_number(n) for n in (8_000_000_000, 136_727_040, 137_000_000, 950, 12_000)] == [
        "8B",
        "136.73M",
        "137M",
        "950",
        "12K",
    ]


def test_quantization_mix_follows_llama_cpp() -> None:
    arch = CATALOG["llama3.1:8b"].arch
    by_name = {t.name: t for t in tensors(arch)}
    q4km = FileType.Q4_K_M
    assert tensor_type(arch, by_name["output.weight"], q4km) == "Q6_K"
    assert tensor_type(arch, by_name["token_embd.weight"], q4km) == "Q4_K"
    assert tensor_type(arch, by_name["blk.0.attn_v.weight"], q4km) == "Q6_K"  # first eighth: more bits
    assert tensor_type(arch, by_name["blk.4.attn_v.weight"], q4km) == "Q4_K"
    assert tensor_type(arch, by_name["blk.6.ffn_down.weight"], q4km) == "Q6_K"  # every third in the middle
    assert tensor_type(arch, by_name["blk.0.attn_norm.weight"], q4km) == "F32"
    gemma = CATALOG["gemma3:12b"].arch  # tied embeddings are quantized as the output layer
    assert tensor_type(gemma, tensors(gemma)[0], q4km) == "Q6_K"


def test_kv_bytes_per_token_match_kv_memory_md() -> None:
    shape = gateway_shape(CATALOG["llama3.1:8b"])
    assert kv_bytes_per_token(shape) == 128 * 1024
    assert kv_bytes_per_token(shape, CacheType.Q8_0, CacheType.Q8_0) == 68 * 1024
    assert kv_bytes_per_token(shape, CacheType.Q4_0, CacheType.Q4_0) == 36 * 1024
    assert ollama_kv_cache_bytes(shape, num_ctx=8192, num_parallel=1) == 2**30


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_model_info_parses_back_to_the_same_kv_shape(name: str) -> None:
    spec = CATALOG[name]
    parsed = shape_from_metadata(model_info(spec))
    assert ollama_kv_cache_bytes(parsed, num_ctx=8192, num_parallel=2) == ollama_kv_cache_bytes(
        gateway_shape(spec), num_ctx=8192, num_parallel=2
    )
    if not spec.is_embedding:
        assert parsed == gateway_shape(spec)


def test_model_info_hides_arrays_unless_verbose() -> None:
    spec = CATALOG["llama3.1:8b"]
    info = model_info(spec)
    assert info["tokenizer.ggml.tokens"] is None and info["tokenizer.ggml.merges"] is None
    assert info["llama.attention.head_count_kv"] == 8 and info["llama.context_length"] == 131072
    assert "general.name" not in info
    assert model_info(spec, arrays={"tokenizer.ggml.tokens": ["a"]})["tokenizer.ggml.tokens"] == ["a"]


def test_gemma3_declares_its_sliding_window() -> None:
    spec = CATALOG["gemma3:12b"]
    assert gateway_shape(spec).swa_layers.count(False) == 8  # every 6th of 48 layers is global
    assert model_info(spec)["gemma3.attention.sliding_window"] == 1024
    assert model_info(spec)["gemma3.attention.key_length"] == 256


@pytest.mark.parametrize("name", sorted(set(PRESETS) & set(CATALOG)))
def test_catalog_agrees_with_the_memory_presets(name: str) -> None:
    preset, spec = PRESETS[name], CATALOG[name]
    assert (preset.n_layers, preset.n_embd, preset.n_head, preset.n_head_kv, preset.head_dim, preset.n_ctx_train) == (
        spec.arch.n_layers,
        spec.arch.n_embd,
        spec.arch.n_head,
        spec.arch.n_head_kv,
        spec.arch.head_dim,
        spec.n_ctx_train,
    )
    quant = spec.file_type.label if spec.file_type.label in preset.weights_mb else "Q4_K_M"
    if quant == spec.file_type.label:
        assert abs(spec.file_bytes / 1e6 - preset.weights_mb[quant]) / preset.weights_mb[quant] < 0.01


def test_real_tokenizers_where_the_vocabulary_ships() -> None:
    llama = tokenizer_for(CATALOG["llama3.1:8b"])
    assert llama.is_real
    # llama-server.md section 7: /tokenize "Hello world, how are you?" on the Llama 3 vocabulary (+ BOS here)
    assert llama.encode("Hello world, how are you?") == [128000, 9906, 1917, 11, 1268, 527, 499, 30]
    assert llama.encode("<|eot_id|>") == [128000, 128009]  # special tokens are parsed
    assert not tokenizer_for(CATALOG["gemma3:12b"]).is_real


def test_stand_in_tokenizer_is_deterministic() -> None:
    tok = tokenizer_for(CATALOG["mistral-nemo:12b"])
    text = "[INST]A fairly ordinary sentence, with punctuation!  And 12345 digits.[/INST]"
    assert tok.encode(text) == tok.encode(text)
    ids = tok.encode(text)
    assert ids[0] == 1 and len(ids) > 10
    assert all(tok.piece(i).startswith(" ") for i in tok.word_ids())


def test_select_names_unknown_models() -> None:
    assert set(select(DEFAULT_MODELS)) == {*(n for n in DEFAULT_MODELS if ":" in n), "nomic-embed-text:latest"}
    with pytest.raises(KeyError, match="unknown model 'gpt-5'"):
        select(("gpt-5",))
