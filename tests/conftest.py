"""Shared pytest configuration."""

from __future__ import annotations

import os
import shutil
import tempfile
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
