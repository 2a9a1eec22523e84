"""The demo workload against the simulator, its outcome classification and the side-by-side table."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

from kvsim.templates import Message
from kvsim.workload.demo import compare
from kvsim.workload.workload import (
    Call,
    Outcome,
    RunReport,
    demo_script,
    demo_sim_config,
    known_prompt_tokens,
    run_workload,
)
from kvsim.workload.workload_report import render_comparison, render_outcomes
from tests.kvsim.helpers import fast, running_sim


async def test_demo_script_shows_ollamas_failure_modes() -> None:
    seen: list[tuple[int, int]] = []
    async with running_sim(fast(num_parallel=2, llama_fit=False)) as url:  # as the demo's: LLAMA_ARG_FIT=off
        report = await run_workload(url, name="direct", progress=lambda done, total, _: seen.append((done, total)))
    script = demo_script()
    total = sum(len(phase) for phase in script)
    assert seen[-1] == (total, total) and len(report.outcomes) == total
    by_user = {o.call.user: o.status for o in report.outcomes}
    assert by_user["bob"] == "truncated"  # 4096 is too small for bob's history: Ollama cut it silently
    assert [o.status for o in report.outcomes if o.call.user.startswith("max-")] == ["failed_oom"] * 2
    assert by_user["dave"] == "completed" and by_user["erin"] == "completed"
    assert report.count("completed") == total - 4
    assert report.reloads >= 2
    truncated = next(o for o in report.outcomes if o.status == "truncated")
    assert truncated.prompt_tokens_reported < truncated.prompt_tokens_known


async def test_timeouts_are_recorded() -> None:
    slow = fast(gen_tokens_per_s=0.01)
    script = [[Call("zoe", "slow", "llama3.1:8b", (Message("user", "hi"),), 4096)]]
    async with running_sim(slow) as url:
        report = await run_workload(url, name="direct", script=script, timeout_s=0.3)
    (outcome,) = report.outcomes
    assert outcome.status == "timed_out" and outcome.error == "no answer within 0.3 s"


def test_known_prompt_tokens_render_like_the_model() -> None:
    call = Call("a", "p", "llama3.1:8b", (Message("user", "Hello world, how are you?"),), None)
    assert known_prompt_tokens(call) == 17


def test_comparison_table() -> None:
    call = Call("a", "p", "llama3.1:8b", (), None)
    left = RunReport(
        "direct",
        [
            Outcome(call, "completed", latency_s=1.0, generated_tokens=5),
            Outcome(call, "failed_oom", error="out of memory"),
        ],
        reloads=7,
        wall_s=3.0,
    )
    right = RunReport(
        "through kvgate", [Outcome(call, "completed", latency_s=0.5, generated_tokens=9)] * 2, reloads=0, wall_s=2.5
    )
    table = render_comparison(left, right).splitlines()
    assert table[0].split() == ["direct", "through", "kvgate"]
    rows = {line[:26].strip(): line[26:].split() for line in table[1:]}
    assert rows["completed"] == ["1", "2"] and rows["failed: out of memory"] == ["1", "0"]
    assert rows["model reloads"] == ["7", "0"] and rows["generated tokens"] == ["5", "18"]
    assert "failed_oom" in render_outcomes(left)


async def test_compare_runs_both_sides_on_fresh_simulators() -> None:
    seen: list[str] = []

    @contextlib.asynccontextmanager
    async def no_gateway(sim_url: str) -> AsyncIterator[str]:
        seen.append(sim_url)
        yield sim_url  # a "gateway" that is the simulator itself: both runs must agree

    config = replace(demo_sim_config(), time_scale=400.0)
    direct, gated = await compare(no_gateway, config=config)
    assert len(seen) == 1 and gated.name == "through kvgate"
    assert [o.status for o in direct.outcomes] == [o.status for o in gated.outcomes]
    assert direct.reloads == gated.reloads > 0
