"""The environment of a ``kvgate serve`` that a test starts as a process of its own: a bare PATH, and the run's
tokenizer cache (``tests/conftest.py``), so the child neither writes to the user's ``~/.cache/kvgate`` nor converts
again a tokenizer the run has converted already. Not for a child whose ``--config`` names a ``counting.cache_dir``:
the environment variable wins over the file."""

from __future__ import annotations

import os
from collections.abc import Mapping

CACHE_ENV = "KVGATE_COUNTING__CACHE_DIR"


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin"}
    if CACHE_ENV in os.environ:
        env[CACHE_ENV] = os.environ[CACHE_ENV]
    env.update(extra or {})
    return env
