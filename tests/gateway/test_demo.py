"""`kvgate demo`: the same workload straight at the simulator and through kvgate; kvgate prevents the failures.

The demo's simulator runs 4x simulated time; here 50 times faster still (``DEMO_SPEEDUP``): the same workload, the same
outcomes and the same table in a fraction of the time (what is left is mostly loading two tokenizers).
"""

from __future__ import annotations

import dataclasses
import io

import pytest

from gateway.cli import build_parser
from gateway.demo_cli import run
from kvsim.config import SimConfig
from kvsim.workload import demo, workload

DEMO_SPEEDUP = 50.0


def _faster() -> SimConfig:
    config = workload.demo_sim_config()
    return dataclasses.replace(config, time_scale=config.time_scale * DEMO_SPEEDUP)


async def test_demo_shows_kvgate_preventing_oom_truncation_and_reloads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "demo_sim_config", _faster)
    out = io.StringIO()
    assert await run(build_parser().parse_args(["demo"]), out=out) == 0
    rows = {}
    for line in out.getvalue().splitlines():
        parts = line.rsplit(maxsplit=2)
        if len(parts) == 3 and parts[1].replace(".", "").isdigit():
            rows[parts[0].strip()] = (parts[1], parts[2])
    direct, gated = zip(*[(float(a), float(b)) for a, b in rows.values()], strict=True)
    table = dict(zip(rows, zip(direct, gated, strict=True), strict=True))
    assert table["failed: out of memory"][0] > 0 and table["failed: out of memory"][1] == 0
    assert table["silently truncated"][0] > 0 and table["silently truncated"][1] == 0
    assert table["model reloads"][0] > 0 and table["model reloads"][1] == 0
    assert table["completed"][1] == table["requests"][1]
