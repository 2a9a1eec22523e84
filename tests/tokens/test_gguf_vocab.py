"""GGUF metadata reading, conversion errors, special tokens, BOS handling and the tokenizer.json cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from tokenizers import Tokenizer

from gateway.support.gguf_reader import GgufFormatError, read_gguf_metadata
from gateway.tokens.gguf_vocab import (
    UnsupportedTokenizer,
    load_gguf_tokenizer,
    read_gguf_tokenizer_metadata,
    tokenizer_from_gguf_metadata,
)
from gateway.tokens.tokenizer_cache import TokenizerCache
from tests.tokens.vocab_vectors import SESSION_CACHE_DIR, shared_tokenizer, vector_tokenizer, vocab_path


def test_tokenizer_metadata_keeps_tokenizer_and_general_keys() -> None:
    meta = read_gguf_tokenizer_metadata(vocab_path("llama-bpe"))
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.pre"] == "llama-bpe"
    assert len(meta["tokenizer.ggml.tokens"]) == 128256
    assert len(meta["tokenizer.ggml.merges"]) == 280147
    assert meta["general.architecture"] == "llama"
    assert not any(k.startswith("llama.") for k in meta)


def test_truncated_gguf_is_unsupported_with_the_path(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(vocab_path("phi-3").read_bytes()[:5000])
    with pytest.raises(GgufFormatError):
        read_gguf_metadata(broken)
    with pytest.raises(UnsupportedTokenizer, match=r"broken\.gguf"):
        load_gguf_tokenizer(broken)


@pytest.mark.parametrize("content", [b"", b"not a gguf file at all, just text" * 4])
def test_non_gguf_file_is_unsupported(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(UnsupportedTokenizer, match="cannot read GGUF metadata"):
        load_gguf_tokenizer(path)


def _meta(vocab: str) -> dict[str, Any]:
    return read_gguf_tokenizer_metadata(vocab_path(vocab))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model 'bert'"),
        ({"tokenizer.ggml.pre": "kimi-k2"}, "tokenizer.ggml.pre 'kimi-k2'"),
        ({"tokenizer.ggml.tokens": None}, "tokens is missing"),
        ({"tokenizer.ggml.merges": None}, "merges is missing"),
    ],
)
def test_unsupported_names_model_and_reason(change: dict[str, Any], reason: str) -> None:
    meta = {**_meta("gpt-2"), **change}
    with pytest.raises(UnsupportedTokenizer, match=reason) as info:
        tokenizer_from_gguf_metadata(meta, model_name="m:latest")
    assert info.value.model == "m:latest"
    assert "m:latest" in str(info.value)


def test_spm_without_scores_is_unsupported() -> None:
    meta = {**_meta("llama-spm"), "tokenizer.ggml.scores": None}
    with pytest.raises(UnsupportedTokenizer, match="scores"):
        tokenizer_from_gguf_metadata(meta)


def test_ollama_model_info_json_round_trip() -> None:
    # Ollama's verbose /api/show returns the same keys as JSON: lists of strings, ints and floats.
    meta = orjson.loads(orjson.dumps(_meta("llama-spm")))
    tokenizer = tokenizer_from_gguf_metadata(meta)
    assert tokenizer.encode("Hello world", add_special_tokens=False).ids == [15043, 3186]


def test_special_tokens_are_parsed_unless_disabled() -> None:
    # a copy: the cache hands every loader of one file the same object in a process (tokenizer_cache._LOADED)
    tokenizer = Tokenizer.from_str(load_gguf_tokenizer(vocab_path("llama-bpe"), cache_dir=SESSION_CACHE_DIR).to_str())
    text = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    assert tokenizer.encode(text, add_special_tokens=False).ids == [128006, 882, 128007, 271, 13347, 128009]
    tokenizer.encode_special_tokens = True
    assert 128006 not in tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(
    ("vocab", "bos"),
    [("llama-bpe", 128000), ("llama-spm", 1), ("phi-3", 1), ("deepseek-coder", 32013), ("gemma-4", 2)],
)
def test_add_special_tokens_adds_bos_like_llama_cpp(vocab: str, bos: int) -> None:
    tokenizer = shared_tokenizer(vocab)
    plain = tokenizer.encode("Hello", add_special_tokens=False).ids
    assert tokenizer.encode("Hello", add_special_tokens=True).ids == [bos, *plain]


@pytest.mark.parametrize("vocab", ["qwen2", "gpt-2"])
def test_no_bos_where_llama_cpp_adds_none(vocab: str) -> None:
    tokenizer = shared_tokenizer(vocab)
    assert tokenizer.encode("Hello", add_special_tokens=True).ids == tokenizer.encode("Hello").ids


def test_phi3_special_tokens_strip_following_whitespace() -> None:
    tokenizer = shared_tokenizer("phi-3")
    user, end = tokenizer.token_to_id("<|user|>"), tokenizer.token_to_id("<|end|>")
    ids = tokenizer.encode("<|user|>\nHi<|end|>\n", add_special_tokens=False).ids
    # RSTRIP eats the newline after <|user|>; SPM prepends one space to the fragment that follows.
    assert ids == [user, *tokenizer.encode("Hi", add_special_tokens=False).ids, end]


def test_user_defined_tokens_match_even_without_special_parsing() -> None:
    tokenizer = vector_tokenizer("gemma-4")
    tool_call = tokenizer.token_to_id("<|tool_call>")
    assert tool_call in tokenizer.encode("x <|tool_call> y", add_special_tokens=False).ids


def test_cache_builds_once_and_reuses_the_file(tmp_path: Path) -> None:
    first = load_gguf_tokenizer(vocab_path("gpt-2"), cache_dir=tmp_path)
    files = list(tmp_path.glob("*.tokenizer.json"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    second = load_gguf_tokenizer(vocab_path("gpt-2"), cache_dir=tmp_path)
    assert files[0].stat().st_mtime_ns == stamp
    text = "Hello world, 1234567 tokens!"
    assert first.encode(text).ids == second.encode(text).ids


def test_cache_get_or_build_calls_builder_once(tmp_path: Path) -> None:
    cache = TokenizerCache(tmp_path)
    meta = _meta("llama-spm")
    calls = []

    def build() -> str:
        from gateway.tokens.gguf_vocab import tokenizer_json_from_gguf_metadata

        calls.append(1)
        return tokenizer_json_from_gguf_metadata(meta)

    cache.get_or_build("sha256:abc/../x", build)
    cache.get_or_build("sha256:abc/../x", build)
    assert len(calls) == 1
    assert all(p.parent == tmp_path for p in tmp_path.iterdir())


def test_corrupt_cache_file_is_rebuilt(tmp_path: Path) -> None:
    cache = TokenizerCache(tmp_path)
    cache.store("k", "{not json")
    meta = _meta("llama-spm")
    from gateway.tokens.gguf_vocab import tokenizer_json_from_gguf_metadata

    tokenizer = cache.get_or_build("k", lambda: tokenizer_json_from_gguf_metadata(meta))
    assert tokenizer.encode("Hello world", add_special_tokens=False).ids == [15043, 3186]
    assert cache.load("k") is not None


def test_metadata_cache_key_defaults_to_a_digest(tmp_path: Path) -> None:
    meta = _meta("deepseek-coder")
    tokenizer_from_gguf_metadata(meta, cache_dir=tmp_path)
    tokenizer_from_gguf_metadata(meta, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("meta-*.tokenizer.json"))) == 1
