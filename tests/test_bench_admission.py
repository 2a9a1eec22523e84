"""Smoke test of ``bench.admission``: the pure part (planner timing) runs, with few repetitions, and its output has
the expected shape. No speed is asserted here: speed targets belong in bench/, never in timed unit tests."""

from __future__ import annotations

import json

import pytest

from bench import admission
from bench.admission_planner import ACTIVE, build_scene, render_planner, run_planner


def test_scene_holds_1000_reservations() -> None:
    scene = build_scene()
    assert sum(scene.ledger.snapshot(pool.key).active_sequences for pool in scene.pools) == ACTIVE
    assert {pool.unified for pool in scene.pools} == {True, False}


def test_planner_rows_and_table() -> None:
    rows = run_planner(repetitions=400, room_repetitions=60)
    names = [row.name for row in rows]
    assert names[0] == "plan(), all 8 pools" and len(rows) == 5
    assert all(len(row.samples_ns) > 0 and row.median_us > 0 for row in rows)
    outcomes = rows[0].outcomes
    assert {"admit", "reject", "wait (pool)", "wait (tenant)"} <= outcomes.keys()
    assert sum(outcomes.values()) == 400
    table = render_planner(rows)
    assert "median us" in table and "target: median plan() decision <= 50 us" in table
    assert table.rstrip().endswith(("PASS", "FAIL"))


def test_cli_json_planner_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert admission.main(["--quick", "--json", "--planner-only"], planner=lambda *_: run_planner(200, 40)) == 0
    report = json.loads(capsys.readouterr().out)
    planner = report["planner"]
    assert planner["target_median_us"] == 50.0 and isinstance(planner["target_met"], bool)
    assert {"name", "n", "median_us", "p90_us", "p99_us", "outcomes"} <= planner["rows"][0].keys()
    assert "goodput" not in report


def test_bound_formula() -> None:
    work = admission.Workload(clients=8, per_client=8, slots=4, output_tokens=48, prompt_speed=4000.0,
                              gen_speed=60.0, time_scale=8.0, rounds=1)
    c = (100 / 4000 + 48 / 60) / 8
    assert work.request_s(100) == pytest.approx(c)
    assert work.best_makespan_s(100) == pytest.approx(16 * c)  # ceil(64 / 4) slot-rounds
    assert work.bound_tokens_per_s(100) == pytest.approx(64 * 148 / (16 * c))
    few = admission.Workload(2, 5, 4, 48, 4000.0, 60.0, 8.0, 1)  # fewer clients than slots: M rounds bound it
    assert few.best_makespan_s(100) == pytest.approx(5 * c)
