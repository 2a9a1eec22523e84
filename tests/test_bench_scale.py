"""Smoke test of ``bench.scale --quick``: 8 simulated llama-servers behind 3 kvgate replicas sharing one ledger in a
real redis-server, a day in 5 s: no request meets "Context size has been exceeded.", every one is answered or
refused, and the added latency is measured. (The comparison with three in-process ledgers is the full run's, and
tests/admission/shared/test_replicas.py's.) Skipped without redis-server (except on CI, ``CI=true``, where it fails)."""

from __future__ import annotations

import json

import pytest

from bench import scale
from tests.support.redis_server import redis_binary


def test_quick_day_on_three_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    redis_binary()  # skips (or, on CI, fails) without redis-server
    scale.main(["--quick", "--json", "--configs", "shared"])
    report = json.loads(capsys.readouterr().out)
    assert set(report["configs"]) == {"shared"}
    shared = report["configs"]["shared"]
    assert shared["requests"] > 100
    assert shared["out_of_memory"] == 0
    assert shared["ok"] + sum(shared["refused"].values()) == shared["requests"]
    assert shared["added_ms"]["samples"] > 0
