"""Smoke test of ``bench.fairness --quick``: the virtual-time part through the CLI, and one small real run (the
simulator and two kvgates, on 127.0.0.1, a 40-request flood, 2-3 s an order) whose fair order meets the
benchmark's own targets while the arrival order makes the trickle wait behind the flood."""

from __future__ import annotations

import json

import pytest

from bench import fairness


def test_cli_json_virtual_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert fairness.main(["--quick", "--json", "--virtual-only"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "real" not in report
    trickle = report["virtual"]["scenarios"]["trickle"]
    assert set(trickle) == {"fair", "arrival"}
    assert trickle["fair"]["tenants"]["a"]["share"] >= 0.95 * trickle["fair"]["tenants"]["a"]["fair_share"]
    waits = report["virtual"]["median_wait_s_by_flood"]
    assert waits["arrival"]["200"]["a"] > waits["fair"]["200"]["a"]


def test_quick_real_run_meets_the_fair_targets() -> None:
    measured = fairness.measure_processes(fairness.QUICK, rounds=1)
    text = fairness.render_measured(measured)
    assert "order: fair" in text and "order: arrival" in text
    report = fairness.measured_json(measured)
    assert [r["order"] for r in report["rounds"]] == ["fair", "arrival"]
    assert all(r["failed"] == 0 and r["requests"] == 120 for r in report["rounds"])
    assert report["misses"] == [] and report["target_met"], text
    assert text.rstrip().endswith("PASS")
    c = report["flood_request_s"]
    for tenant in fairness.TRICKLE:  # the contrast: behind the flood in arrival order
        assert report["median"]["arrival"][tenant]["median_wait_s"] > 2 * c, text
        assert report["median"]["arrival"][tenant]["share"] < 0.5 * report["median"]["arrival"][tenant]["fair_share"]
