"""Smoke test of ``bench.scale --quick``: 8 simulated llama-servers behind 3 kvgate replicas, a day in 5 s, once with
one shared ledger in a real redis-server and once with three in-process ledgers. With the shared ledger no request
meets "Context size has been exceeded."; the report holds both configurations. Skipped without redis-server
(except on CI, ``CI=true``, where it fails)."""

from __future__ import annotations

import json

import pytest

from bench import scale
from tests.support.redis_server import redis_binary


def test_quick_day_on_three_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    redis_binary()  # skips (or, on CI, fails) without redis-server
    scale.main(["--quick", "--json", "--configs", "shared,independent"])
    report = json.loads(capsys.readouterr().out)
    assert set(report["configs"]) == {"shared", "independent"}
    shared = report["configs"]["shared"]
    assert shared["requests"] == report["configs"]["independent"]["requests"] > 100
    assert shared["out_of_memory"] == 0
    assert shared["ok"] + sum(shared["refused"].values()) == shared["requests"]
    assert shared["added_ms"]["samples"] > 0
