"""Smoke test of ``bench.net_effect --quick``: four cells of the matrix (Ollama with 2 slots, two cold hosts, ``n: 2``
on Ollama's /v1, a dead backend), each straight at the simulator and through a kvgate process in front of it. Only
what is counted is asserted (nothing failed or refused that the backend served); the time targets are the full
run's, never a test's."""

from __future__ import annotations

import json

import pytest

from bench import net_effect
from bench.net_effect_cells import QUICK


def test_quick_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    net_effect.main(["--quick", "--json"])
    report = json.loads(capsys.readouterr().out)
    cells = {cell["name"]: cell for cell in report["cells"]}
    assert set(cells) == set(QUICK)
    for name, cell in cells.items():
        direct, gated = cell["direct"], cell["kvgate"]
        if name == "dead backend":
            assert direct["failed"] == gated["failed"] + gated["refused"] > 0, cell
            assert gated["p95_s"] < 1.0, cell  # a connection refused is answered at once, not after probe_wait_s
            continue
        assert gated["completed"] >= direct["completed"] > 0, cell
        assert gated["failed"] == gated["refused"] == gated["timed_out"] == 0, cell
