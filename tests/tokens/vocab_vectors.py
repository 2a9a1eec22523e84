"""llama.cpp's tokenizer test vectors shipped beside the vocab-only GGUFs in gateway/data/vocab."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tokenizers

from gateway.tokens.gguf_vocab import load_gguf_tokenizer

VOCAB_DIR = Path(__file__).resolve().parents[2] / "gateway" / "data" / "vocab"
_SEPARATOR = "\n__ggml_vocab_test__\n"

SESSION_CACHE_DIR = Path(tempfile.mkdtemp(prefix="kvgate-test-tokenizers-"))
"""A tokenizer cache for this test run only: each vocabulary is converted once per run (gemma-4 takes seconds),
then loaded from its tokenizer.json by every test that builds it again, through kvgate's own cache."""
atexit.register(shutil.rmtree, SESSION_CACHE_DIR, ignore_errors=True)

# Filled by test_vocab_vectors, printed by conftest.pytest_terminal_summary.
VECTOR_RESULTS: dict[str, list[bool]] = {}


@dataclass(frozen=True, slots=True)
class VocabCase:
    vocab: str
    index: int
    text: str
    expected_ids: tuple[int, ...]


def vocab_path(vocab: str) -> Path:
    return VOCAB_DIR / f"ggml-vocab-{vocab}.gguf"


def read_cases(vocab: str) -> list[VocabCase]:
    """Strings and expected ids, split exactly as tests/test-tokenizer-0.cpp splits the .inp file."""
    raw = (VOCAB_DIR / f"ggml-vocab-{vocab}.gguf.inp").read_text(encoding="utf-8")
    texts = raw.split(_SEPARATOR)
    if raw.endswith(_SEPARATOR):
        texts.pop()
    lines = (VOCAB_DIR / f"ggml-vocab-{vocab}.gguf.out").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(lines), f"{vocab}: {len(texts)} strings but {len(lines)} id lines"
    return [
        VocabCase(vocab, i, text, tuple(int(x) for x in line.split()))
        for i, (text, line) in enumerate(zip(texts, lines, strict=True))
    ]


@functools.cache
def warmed_cache_dir(vocab: str) -> Path:
    """SESSION_CACHE_DIR with `vocab` converted in it, for tests that start kvgate but are not about converting.

    A kvgate configured with `counting.cache_dir` here and the vocabulary's GGUF loads the cached tokenizer.json
    (the key is the GGUF's key/value digest) instead of converting it again in every such test.
    """
    load_gguf_tokenizer(vocab_path(vocab), cache_dir=SESSION_CACHE_DIR)
    return SESSION_CACHE_DIR


@functools.cache
def shared_tokenizer(vocab: str) -> tokenizers.Tokenizer:
    """The converted tokenizer with special-token parsing on (llama-server's chat path); shared: do not mutate."""
    return load_gguf_tokenizer(vocab_path(vocab), cache_dir=SESSION_CACHE_DIR)


@functools.cache
def vector_tokenizer(vocab: str) -> tokenizers.Tokenizer:
    """The converted tokenizer with special-token parsing off, as the vectors were made (parse_special=false)."""
    # a copy to change: the cache hands every loader of one file the same object (tokenizer_cache._LOADED), and
    # shared_tokenizer's, kvgate's own in-process counts, parse special tokens
    shared = load_gguf_tokenizer(vocab_path(vocab), cache_dir=SESSION_CACHE_DIR)
    tokenizer = tokenizers.Tokenizer.from_str(shared.to_str())
    tokenizer.encode_special_tokens = True
    return tokenizer


def warm_sim_tokenizers(*models: str) -> Path:
    """SESSION_CACHE_DIR, with the simulator's tokenizers of `models` built in this process (through that cache).

    For a test's setup: a simulator started with ``SimConfig(tokenizer_cache_dir=...)`` here finds them built (the
    simulator keeps one tokenizer per vocabulary per process), and the tokenizer.json files are the ones
    `shared_tokenizer` and `warmed_cache_dir` use (the same ``gguf-{digest}`` keys), so each vocabulary is converted
    once per run whichever comes first.
    """
    from kvsim.catalog import CATALOG
    from kvsim.vocab import tokenizer_for

    for model in models:
        tokenizer_for(CATALOG[model], cache_dir=SESSION_CACHE_DIR)
    return SESSION_CACHE_DIR
