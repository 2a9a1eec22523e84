"""The demo's engine: a workload against a fresh simulator directly, then through a gateway, side by side.

``gateway`` is the caller's: given the simulator's URL it starts whatever sits in front of it (kvgate) and yields
that URL. Each run gets its own simulator, so both start cold with the same seed and see the same workload.

    compare              the six users on one model (``workload.demo_script``)
    compare_multi_model  three models on one GPU, a foreign process halfway (``multi_model``)
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from kvsim.config import SimConfig
from kvsim.runner import start_sim
from kvsim.workload.multi_model import multi_model_script, multi_model_sim_config
from kvsim.workload.workload import GatewayCounts, Progress, RunReport, demo_sim_config, run_workload

GatewayFactory = Callable[[str], contextlib.AbstractAsyncContextManager[str]]
_Run = Callable[[str, str, str | None], Awaitable[RunReport]]
"""(URL to send to, the run's name, the simulator's URL when something is in front) -> the run's report."""


async def _both(
    gateway: GatewayFactory, cfg: SimConfig, names: tuple[str, str], run: _Run
) -> tuple[RunReport, RunReport]:
    runner, url = await start_sim(cfg)
    try:
        direct = await run(url, names[0], None)
    finally:
        await runner.cleanup()
    runner, url = await start_sim(cfg)
    try:
        async with gateway(url) as front:
            gated = await run(front, names[1], url)
    finally:
        await runner.cleanup()
    return direct, gated


async def compare(
    gateway: GatewayFactory,
    *,
    config: SimConfig | None = None,
    progress: Progress | None = None,
    timeout_s: float = 20.0,
    names: tuple[str, str] = ("direct", "through kvgate"),
) -> tuple[RunReport, RunReport]:
    """(direct run, gateway run); render them with ``workload_report.render_comparison``."""

    async def run(url: str, name: str, sim_url: str | None) -> RunReport:
        return await run_workload(url, name=name, sim_url=sim_url, progress=progress, timeout_s=timeout_s)

    return await _both(gateway, config or demo_sim_config(), names, run)


async def compare_multi_model(
    gateway: GatewayFactory,
    *,
    gateway_counts: GatewayCounts | None = None,
    config: SimConfig | None = None,
    progress: Progress | None = None,
    timeout_s: float = 20.0,
    names: tuple[str, str] = ("direct", "through kvgate"),
) -> tuple[RunReport, RunReport]:
    """The multi-model workload (``multi_model``), direct then through ``gateway``; ``gateway_counts`` reads the
    gateway's own loads and unloads while it runs. Render with ``render_comparison(..., rows=MULTI_MODEL_ROWS)``."""
    phases, events = multi_model_script()

    async def run(url: str, name: str, sim_url: str | None) -> RunReport:
        return await run_workload(url, name=name, sim_url=sim_url, script=phases, gpu_events=events,
                                  progress=progress, timeout_s=timeout_s,
                                  gateway_counts=gateway_counts if sim_url is not None else None)  # fmt: skip

    return await _both(gateway, config or multi_model_sim_config(), names, run)
