"""Pure parsers of Ollama and llama-server answers (llama-server JSON recorded from the real tiny server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.memory.kv import kv_bytes_per_token
from gateway.memory.presets import preset_profile
from gateway.memory.sources.common import ProfileError, quantization_name, tensor_bytes
from gateway.memory.sources.llama_server_answers import (
    ServerProps,
    check_unified,
    parse_models,
    parse_props,
    parse_slots,
    profile_from_llama_server,
)
from gateway.memory.sources.ollama_answers import (
    modelfile_num_ctx,
    needs_verbose,
    parse_ps,
    parse_tags,
    profile_from_show,
)
from tests.support.fake_backend import show_answer

DATA = Path(__file__).parent / "data"


def _json(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def test_ollama_show_of_a_dense_model_needs_no_verbose() -> None:
    show = show_answer("ggml-vocab-llama-bpe.gguf", verbose=False)
    assert not needs_verbose(show)  # tokenizer arrays are null too, but they do not size the KV cache
    profile = profile_from_show("llama3.1:8b", show, size_bytes=4_920_734_016, digest="sha256:abc")
    assert kv_bytes_per_token(profile.shape) == 131072
    assert profile.context_tokens == 8192
    assert profile.quantization == "Q4_K_M"
    assert profile.capabilities == ("completion", "tools")
    assert profile.cache_key == "ollama:sha256:abc"
    assert profile.weights_bytes == tensor_bytes("Q4_K", [4096, 128256]) + 4 * 4096


def test_ollama_show_with_null_per_layer_array_needs_verbose() -> None:
    show = show_answer("ggml-vocab-gemma-4.gguf", verbose=False)
    assert show["model_info"]["gemma4.attention.head_count_kv"] is None
    assert needs_verbose(show)
    with pytest.raises(ValueError, match="verbose=true"):
        profile_from_show("gemma4", show)
    verbose = show_answer("ggml-vocab-gemma-4.gguf", verbose=True)
    assert not needs_verbose(verbose)
    assert kv_bytes_per_token(profile_from_show("gemma4", verbose).shape) == 225280


def test_ollama_show_without_model_info_is_refused() -> None:
    with pytest.raises(ProfileError, match="no model_info"):
        profile_from_show("cloud-model", {"details": {}})


@pytest.mark.parametrize(
    ("parameters", "num_ctx"),
    [("num_ctx 8192", 8192), ('stop "x"\nnum_ctx    32768\n', 32768), ("", None), (None, None), ("num_ctxx 5", None)],
)
def test_modelfile_num_ctx(parameters: str | None, num_ctx: int | None) -> None:
    assert modelfile_num_ctx(parameters) == num_ctx


def test_parse_ps_and_tags() -> None:
    ps = {"models": [{
        "name": "llama3.1:8b", "model": "llama3.1:8b", "size": 6_654_000_000, "size_vram": 4_990_500_000,
        "digest": "sha256:abc", "details": {"quantization_level": "Q4_K_M"}, "expires_at": "2026-11-29T20:00:00Z",
        "context_length": 8192,
    }]}
    (loaded,) = parse_ps(ps)
    assert (loaded.name, loaded.context_tokens, loaded.quantization) == ("llama3.1:8b", 8192, "Q4_K_M")
    assert loaded.offloaded_fraction == pytest.approx(0.25)
    tags = parse_tags({"models": [{"name": "qwen2.5:7b", "model": "qwen2.5:7b", "digest": "d", "size": 4}]})
    assert tags["qwen2.5:7b"].size_bytes == 4
    with pytest.raises(ProfileError, match="'models' list"):
        parse_ps({})


def test_parse_recorded_llama_server_answers() -> None:
    props = parse_props(_json("llama_server_props.json"))
    assert (props.n_ctx_slot, props.total_slots, props.is_sleeping) == (2048, 2, False)
    meta = parse_models(_json("llama_server_models.json"))
    assert (meta.n_ctx_train, meta.n_vocab, meta.n_embd, meta.n_ctx_slot) == (8192, 128256, 64, 2048)
    slots = parse_slots(_json("llama_server_slots.json"))
    assert [(s.slot_id, s.n_ctx, s.is_processing, s.n_tokens) for s in slots] == [
        (0, 2048, False, 0), (1, 2048, False, 0)
    ]


def test_parse_busy_slot_with_next_token_array() -> None:
    slot = {"id": 3, "n_ctx": 4096, "is_processing": True, "id_task": 7, "n_prompt_tokens": 1422,
            "next_token": [{"has_next_token": True, "n_remain": 1400, "n_decoded": 100}]}
    (state,) = parse_slots([slot])
    assert (state.n_tokens, state.n_decoded, state.n_remain, state.is_processing) == (1422, 100, 1400, True)


def test_llama_server_profile_needs_a_shape_source() -> None:
    props, meta = parse_props(_json("llama_server_props.json")), parse_models(_json("llama_server_models.json"))
    with pytest.raises(ProfileError, match="not readable here"):
        profile_from_llama_server(props, meta, None)
    profile = profile_from_llama_server(props, meta, None, fallback=preset_profile("llama3.1:8b"))
    assert (profile.weights_bytes, profile.context_tokens, profile.parallel) == (16_565_504, 2048, 2)


def _props(n_ctx_slot: int, total_slots: int) -> ServerProps:
    return ServerProps(n_ctx_slot, total_slots, "/m.gguf", "m", "b1", False)


@pytest.mark.parametrize(
    ("configured_unified", "parallel", "ctx_size", "props", "warns"),
    [
        (False, 4, 8192, _props(2048, 4), None),  # split as configured
        (True, 4, 8192, _props(8192, 4), None),  # unified as configured
        (True, 4, 8192, _props(2048, 4), "matches a split pool"),
        (False, 4, 8192, _props(8192, 4), "matches a unified pool"),
        (False, 2, 8192, _props(2048, 4), "total_slots=4"),
        (False, None, None, _props(8192, 4), None),  # -c unknown: cannot tell
        (True, 1, 4096, _props(4096, 1), None),  # one slot: both layouts agree
    ],
)
def test_check_unified(
    configured_unified: bool, parallel: int | None, ctx_size: int | None, props: ServerProps, warns: str | None
) -> None:
    warning = check_unified(
        configured_unified=configured_unified, configured_parallel=parallel, configured_ctx_size=ctx_size,
        props=props, n_ctx_train=131072,
    )
    if warns is None:
        assert warning is None
    else:
        assert warning is not None and warns in warning


def test_quantization_names() -> None:
    assert [quantization_name(v) for v in (15, 7, 1, 0, 999, None, "15")] == [
        "Q4_K_M", "Q8_0", "F16", "F32", None, None, None
    ]
    with pytest.raises(ProfileError, match="unknown tensor type"):
        tensor_bytes("Q9_Z", [10])
