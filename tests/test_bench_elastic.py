"""Smoke test of ``bench.elastic``: the simulated llama-server's unified pool, the backend alone and two kvgates
(fixed and elastic reservations) side by side, the short mix in one small round: the table prints, and no request
fails through either kvgate. (The long-tailed mix and the timing targets are the benchmark's own runs.)"""

from __future__ import annotations

import json

import pytest

from bench import elastic
from bench.elastic_report import ARMS, DIRECT, ELASTIC, FIXED, HEADER, SHORT


def test_short_mix_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    elastic.main(["--quick", "--json", "--requests", "16", "--mixes", "short"])
    report = json.loads(capsys.readouterr().out)
    assert HEADER in report["table"]
    assert "target: backend failures through kvgate elastic = 0" in report["table"]
    arms = report["arms"][SHORT]
    assert set(arms) == set(ARMS)
    for arm in (FIXED, ELASTIC):
        assert arms[arm]["failures"] == arms[arm]["backend_failed"] == 0, arms[arm]["errors"]
        assert arms[arm]["completed"] == arms[arm]["requests"] == 16
        assert arms[arm]["cut"] == 0
    assert arms[ELASTIC]["elastic"] > 0  # warmed past min_samples: its replies were admitted elastic
    assert arms[DIRECT]["completed"] == 16
