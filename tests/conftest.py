"""Shared pytest configuration.

The tests mirror the packages: a unit test of ``gateway/<package>/<module>.py`` is ``tests/<package>/test_<module>.py``
(of a root module such as ``gateway/streaming.py``, ``tests/test_streaming.py``; of kvsim, ``tests/kvsim/``). The unit
tests of ``gateway/support`` are in ``tests/gateway_support/``, because ``tests/support/`` holds the tests' own helpers
(fake backends, clocks, servers), imported everywhere as ``tests.support``. Tests that start kvgate (``create_app``,
``running_gateway``, ``kvgate serve``) in front of a backend, fake or real, are in ``tests/e2e/``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.child_env import CACHE_ENV

pytest_plugins = ["tests.conftest_llama"]



_own_cache_dir: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Tokenizers kvgate converts during the tests go to a directory of this run, never the user's
    ~/.cache/kvgate (a test that wants a cold cache gives its own ``counting.cache_dir``)."""
    if CACHE_ENV not in os.environ:
        path = tempfile.mkdtemp(prefix="kvgate-test-tokenizers-")
        os.environ[CACHE_ENV] = path
        _own_cache_dir.append(path)


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _own_cache_dir:
        os.environ.pop(CACHE_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


WARM_UP_FROM_ITEMS = 200
"""A run of at least this many tests converts the shipped vocabularies once, before the first test."""
_warm_up_s: list[float] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a large run, build what many tests share once, before the first test, rather than inside whichever test
    happens to come first (gemma-4 alone converts in about 2 s): the test side's converted tokenizers
    (``shared_tokenizer``, ``vector_tokenizer``), the simulator's (one per vocabulary per process), kvgate's own for
    the simulator's common models, and Hypothesis's Unicode tables. Every test that is about converting (a cold
    kvgate, the tokenizer cache) still starts from an empty cache of its own."""
    if len(session.items) < WARM_UP_FROM_ITEMS:
        return
    from kvsim.catalog import CATALOG
    from tests.tokens.vocab_vectors import shared_tokenizer, vector_tokenizer, warm_sim_tokenizers

    started = time.monotonic()
    for vocab in ("llama-bpe", "qwen2", "gpt-2", "deepseek-coder", "llama-spm", "phi-3", "gemma-4"):
        shared_tokenizer(vocab)
        vector_tokenizer(vocab)
    warm_sim_tokenizers(*(name for name, spec in CATALOG.items() if spec.vocab is not None))
    asyncio.run(_warm_kvgate_tokenizers(KVGATE_WARM_MODELS))
    _warm_hypothesis_text()
    _warm_up_s.append(time.monotonic() - started)


def _warm_hypothesis_text() -> None:
    """Hypothesis builds its Unicode tables (~2 s in a fresh checkout, then kept in .hypothesis/) the first time a
    test draws text: built here, not in whichever property test draws text first."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=1, database=None)
    @given(st.text(max_size=1))
    def draw(text: str) -> None:
        del text

    draw()


KVGATE_WARM_MODELS = ("llama3.1:8b", "qwen2.5:7b", "qwen2.5:32b", "phi3:mini")
"""The simulator's models most tests send: kvgate's own tokenizers for them are converted before a large run, into
the run's counting cache, through kvgate's Ollama path (``OllamaShowSource``: /api/tags digest, verbose /api/show)."""


async def _warm_kvgate_tokenizers(models: tuple[str, ...]) -> None:
    import aiohttp

    from gateway.backends.client import BackendClient
    from gateway.tokens.sources import OllamaShowSource
    from kvsim.config import SimConfig
    from kvsim.runner import start_sim
    from tests.tokens.vocab_vectors import SESSION_CACHE_DIR

    runner, url = await start_sim(SimConfig(models=models, tokenizer_cache_dir=SESSION_CACHE_DIR))
    try:
        async with aiohttp.ClientSession() as session:
            client = BackendClient(session, url)
            for model in models:
                await OllamaShowSource(client, model, cache_dir=Path(os.environ[CACHE_ENV])).load()
    finally:
        await runner.cleanup()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _warm_up_s:
        terminalreporter.write_line(f"shared tokenizers and tables built before the tests in {_warm_up_s[0]:.1f} s")
