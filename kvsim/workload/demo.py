"""The demo's engine: the workload against a fresh simulator directly, then through a gateway, side by side.

``gateway`` is the caller's: given the simulator's URL it starts whatever sits in front of it (kvgate) and yields
that URL. Each run gets its own simulator, so both start cold with the same seed and see the same workload.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from kvsim.config import SimConfig
from kvsim.runner import start_sim
from kvsim.workload.workload import Progress, RunReport, demo_sim_config, run_workload

GatewayFactory = Callable[[str], contextlib.AbstractAsyncContextManager[str]]


async def compare(
    gateway: GatewayFactory,
    *,
    config: SimConfig | None = None,
    progress: Progress | None = None,
    timeout_s: float = 20.0,
    names: tuple[str, str] = ("direct", "through kvgate"),
) -> tuple[RunReport, RunReport]:
    """(direct run, gateway run); render them with ``workload_report.render_comparison``."""
    cfg = config or demo_sim_config()
    runner, url = await start_sim(cfg)
    try:
        direct = await run_workload(url, name=names[0], progress=progress, timeout_s=timeout_s)
    finally:
        await runner.cleanup()
    runner, url = await start_sim(cfg)
    try:
        async with gateway(url) as front:
            gated = await run_workload(front, name=names[1], sim_url=url, progress=progress, timeout_s=timeout_s)
    finally:
        await runner.cleanup()
    return direct, gated
