"""Issue 12, point 7, end to end: three models on one 24 GiB simulated GPU, users switching between them, a foreign
process taking 8 GiB halfway (``kvsim.workload.multi_model``). Straight at the simulator: out-of-memory failures.
Through kvgate (the demo's own ``KvgateInFront``, its ``vram`` source the simulator's exporter): none, the loads
that can't fit refused with 503 and Retry-After, and no more loads than the workload's model switches.

Failures are counted by the simulator's truth: its out-of-memory answers (``failed_oom``) and ``/sim/stats``
(``load_failures``: loads that did not fit the GPU; ``runtime_ooms``: runners crashed on an oversubscribed GPU).
"""

from __future__ import annotations

import dataclasses

import pytest

from gateway.cli.demo import KvgateInFront
from kvsim.config import SimConfig
from kvsim.workload.demo import compare_multi_model
from kvsim.workload.multi_model import FOREIGN, MODELS, model_switches, multi_model_script, multi_model_sim_config
from kvsim.workload.workload import Call, Outcome, RunReport
from kvsim.workload.workload_report import MULTI_MODEL_ROWS, render_comparison
from tests.tokens.vocab_vectors import warm_sim_tokenizers

TIME_SCALE = 400.0
"""100x the demo's 4x: a 2 s load takes 5 ms."""


@pytest.fixture
def config() -> SimConfig:
    cache = warm_sim_tokenizers(*MODELS)
    return dataclasses.replace(multi_model_sim_config(time_scale=TIME_SCALE), tokenizer_cache_dir=cache)


def _front(config: SimConfig) -> KvgateInFront:
    """kvgate as the demo runs it, on a compressed timeline: a model stays at least 5 ms (2 simulated s) before it
    may be unloaded for another; a load waits at most 0.5 s for room; kvgate's tokenizers from the run's counting
    cache (tests/conftest.py converts them before a large run). The simulator runs this workload with llama.cpp's
    fit off (multi_model.py: a load that does not fit fails), and kvgate is told so."""
    return KvgateInFront(residency={"min_resident_s": 2.0 / TIME_SCALE, "load_wait_s": 0.5}, cpu_offload="off")


def _window(report: RunReport) -> list[Outcome]:
    """The outcomes of the phases the foreign process shares the GPU with."""
    phases, events = multi_model_script()
    start, end = sorted(events)  # the process starts before phase `start` and ends before phase `end`
    first = sum(len(phase) for phase in phases[:start])
    return report.outcomes[first:first + sum(len(phase) for phase in phases[start:end])]


async def test_three_models_and_a_foreign_process_oom_straight_and_never_through_kvgate(config: SimConfig) -> None:
    front = _front(config)
    direct, gated = await compare_multi_model(front, gateway_counts=front.counts, config=config, timeout_s=10.0)
    phases, _ = multi_model_script()
    switches = model_switches(phases)
    assert switches == len(phases) == 9  # every phase needs another model than the one before

    # straight at the simulator: loads that don't fit the GPU, answered with the runtime's out-of-memory
    assert direct.count("failed_oom") >= 1 and direct.load_failures >= direct.count("failed_oom")
    assert direct.count("refused") == 0
    assert any(o.status == "failed_oom" for o in _window(direct))  # the foreign process's doing
    assert any(o.status == "failed_oom" for o in direct.outcomes[:5])  # and bob's num_ctx 16384 before it

    # through kvgate: no out-of-memory at all, by the simulator's own counters
    assert gated.count("failed_oom") == 0 and gated.load_failures == 0 and gated.runtime_ooms == 0
    refused = [o for o in gated.outcomes if o.status == "refused"]
    assert refused and all(o in _window(gated) for o in refused)  # only while the foreign process holds 8 GiB
    for o in refused:
        assert o.http_status == 503 and o.retry_after.isdigit() and int(o.retry_after) >= 1
        assert o.error.startswith("kvgate did not load") and "bytes are free" in o.error
        assert o.call.model != "llama3.1:8b"  # the model that fits alongside the process kept serving
    assert gated.count("completed") == len(gated.outcomes) - len(refused)

    # loads and unloads: kvgate's own counters, the simulator's agree (nothing loaded behind kvgate's back)
    assert gated.gateway_loads is not None and gated.gateway_unloads is not None
    assert (gated.loads, gated.unloads) == (gated.gateway_loads, gated.gateway_unloads)
    # The bound: one load per model switch at most (each phase wants one model; a switch loads it once, a refused
    # switch loads nothing), so loads <= switches; and an unload only ever makes room for a load, the last model
    # staying resident: unloads <= loads - 1.
    assert 1 <= gated.gateway_loads <= switches
    assert gated.gateway_unloads <= gated.gateway_loads - 1
    # here exactly: 9 switches, minus 2 refused (qwen, gemma while the process runs), minus llama's return during
    # it (still resident: the refusals unloaded nothing)
    assert (gated.gateway_loads, gated.gateway_unloads) == (6, 5)
    assert direct.loads + direct.load_failures > gated.gateway_loads

    table = render_comparison(direct, gated, MULTI_MODEL_ROWS)
    assert "3 models: failed: out of memory" in table and "3 models: loads by kvgate" in table


def test_model_switches_and_the_multi_model_rows() -> None:
    call = Call("a", "models", "m1", (), None)
    other = dataclasses.replace(call, model="m2")
    assert model_switches([[call], [call, call], [other], [call, other], [other]]) == 3
    assert FOREIGN.nbytes == 8 << 30
    left = RunReport("direct", [Outcome(call, "failed_oom"), Outcome(call)], reloads=0, wall_s=1.0, loads=4,
                     unloads=3, load_failures=2)  # fmt: skip
    right = RunReport("through kvgate", [Outcome(call, "refused"), Outcome(call)], reloads=0, wall_s=1.0, loads=3,
                      unloads=2, gateway_loads=3, gateway_unloads=2)  # fmt: skip
    lines = render_comparison(left, right, (), sections=[("three models:", left, right, MULTI_MODEL_ROWS)])
    rows = {line[:38].strip(): line[38:].split() for line in lines.splitlines()[2:]}
    assert rows["3 models: failed: out of memory"] == ["1", "0"]
    assert rows["3 models: refused (503, Retry-After)"] == ["0", "1"]
    assert rows["3 models: loads (GPU)"] == ["4", "3"] and rows["3 models: loads by kvgate"] == ["-", "3"]
    assert rows["3 models: unloads by kvgate"] == ["-", "2"] and rows["3 models: model switches"] == ["9", "9"]
