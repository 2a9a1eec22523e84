"""Shared pytest configuration."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.conftest_llama"]

CACHE_ENV = "KVGATE_COUNTING__CACHE_DIR"


@pytest.fixture(scope="session", autouse=True)
def _tokenizer_cache_of_this_run() -> Iterator[None]:
    """Tokenizers kvgate converts during the tests go to a directory of this run, never the user's
    ~/.cache/kvgate (a test that wants a cold cache gives its own ``counting.cache_dir``)."""
    if CACHE_ENV in os.environ:
        yield
        return
    path = tempfile.mkdtemp(prefix="kvgate-test-tokenizers-")
    os.environ[CACHE_ENV] = path
    try:
        yield
    finally:
        os.environ.pop(CACHE_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


WARM_UP_FROM_ITEMS = 200
"""A run of at least this many tests converts the shipped vocabularies once, before the first test."""
_warm_up_s: list[float] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a large run, build the tokenizers that many tests share once, before the first test, rather than inside
    whichever test happens to come first (gemma-4 alone converts in about 2 s): the test side's converted tokenizers
    (``shared_tokenizer``, ``vector_tokenizer``) and the simulator's (one per vocabulary per process). Every test
    that is about converting (a cold kvgate, the tokenizer cache) still starts from an empty cache of its own."""
    if len(session.items) < WARM_UP_FROM_ITEMS:
        return
    from kvsim.catalog import CATALOG
    from tests.tokens.vocab_vectors import shared_tokenizer, vector_tokenizer, warm_sim_tokenizers

    started = time.monotonic()
    for vocab in ("llama-bpe", "qwen2", "gpt-2", "deepseek-coder", "llama-spm", "phi-3", "gemma-4"):
        shared_tokenizer(vocab)
        vector_tokenizer(vocab)
    warm_sim_tokenizers(*(name for name, spec in CATALOG.items() if spec.vocab is not None))
    _warm_up_s.append(time.monotonic() - started)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _warm_up_s:
        terminalreporter.write_line(f"shared tokenizers converted before the tests in {_warm_up_s[0]:.1f} s")
