"""Splitting long texts at safe line starts never changes a count; the count cache stays within its bounds."""

from __future__ import annotations

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.tokens.countable_text import ByteText, content_text, decode_text
from gateway.tokens.engine import TokenizerEngine
from gateway.tokens.message_cache import CountCache
from tests.tokens.chat_corpus import CODE, SENTENCES
from tests.tokens.vocab_vectors import shared_tokenizer


def _tokenizer(vocab: str) -> tokenizers.Tokenizer:
    return shared_tokenizer(vocab)


LINES = st.lists(st.sampled_from([*SENTENCES, *CODE, "", " ", "\t", "\r", "x\n y", "é", "  \n\n"]), max_size=60)


@pytest.fixture(params=["llama-bpe", "qwen2", "gemma-4"])
def chunkable_tokenizer(request: pytest.FixtureRequest) -> tokenizers.Tokenizer:
    """Each vocabulary in its own case, built in the setup (the first to build it in a run converts it)."""
    return _tokenizer(str(request.param))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LINES, repeat=st.integers(min_value=1, max_value=40))
def test_chunked_count_equals_whole_count(
    chunkable_tokenizer: tokenizers.Tokenizer, lines: list[str], repeat: int
) -> None:
    text = "\n".join(lines * repeat)
    engine = TokenizerEngine(chunkable_tokenizer, chunkable=True)
    assert engine.count_uncached([text]) == [len(chunkable_tokenizer.encode(text, add_special_tokens=False).ids)]


async def test_engine_caches_and_deduplicates() -> None:
    engine = TokenizerEngine(_tokenizer("gpt-2"), chunkable=True)
    counts = await engine.count(["hello world", "hello world", "", "bye"])
    assert counts == [2, 2, 0, 1]
    assert engine.cache.misses == 4 and len(engine.cache) == 3
    await engine.count(["bye", "hello world"])
    assert engine.cache.hits == 2


async def test_large_batches_are_counted_off_the_event_loop() -> None:
    engine = TokenizerEngine(_tokenizer("llama-bpe"), chunkable=True)
    text = "\n".join(SENTENCES) * 200
    (count,) = await engine.count([text])
    assert count == len(_tokenizer("llama-bpe").encode(text, add_special_tokens=False).ids)


def test_count_cache_bounds_entries_and_chars() -> None:
    cache = CountCache(max_entries=3, max_chars=10)
    for text in ("aaaa", "bbbb", "cc"):
        cache.put(text, 1)
    cache.get("aaaa")
    cache.put("dddd", 2)  # 14 chars > 10: the least recently used ("bbbb") goes first
    assert cache.get("bbbb") is None and cache.get("aaaa") == 1
    assert cache.chars <= 10 and len(cache) <= 3
    cache.put("x" * 11, 5)  # larger than the whole budget: not kept
    assert cache.get("x" * 11) is None
    cache.clear()
    assert len(cache) == 0 and cache.chars == 0


def test_text_helpers_never_raise() -> None:
    assert decode_text(b"\xff") == ByteText(1)
    assert decode_text("ok") == "ok"
    assert content_text(None) == ""
    assert content_text(b"\xe2\x82\xac") == "\u20ac"
    assert content_text({"weird": 1}) == '{"weird":1}'
    assert content_text(["a", {"type": "text", "text": "b"}, {"type": "image"}], separator="|") == "a|b"
