"""``kvgate demo``: scripted workloads against the simulated GPU, straight and then through kvgate.

Needs no GPU and no network: the simulator (an Ollama on a virtual 24 GiB GPU) and the gateway both run in this
process on 127.0.0.1. Two comparisons, each run straight at a fresh simulator and then through kvgate in front of
another: six users on one model (OOM, silent truncation, reloads), then three models that don't fit the GPU together,
users switching between them and a foreign process taking 8 GiB halfway (``kvsim.workload.multi_model``). Ends with
one side-by-side table. The gateway reads the simulated GPU as it reads a real one on another host, through the
exporter URL the simulator serves; the simulator (``kvsim``) is imported only when the demo runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from aiohttp import web

from gateway.app import LOADS, create_app, start_server
from gateway.config.settings import FirstBackendSettings, load_settings

if TYPE_CHECKING:
    from kvsim.config import SimConfig
    from kvsim.workload.workload import RunReport

PARTS = ("all", "one-model", "three-models")
MIN_RESIDENT_SIM_S = 2.0
"""The multi-model phase's ``residency.min_resident_s``, in simulated seconds (about one load): kvgate runs on real
time, so it is divided by the simulator's time scale."""
LOAD_WAIT_SIM_S = 30.0
"""Its ``residency.load_wait_s`` in simulated seconds (never under ``LOAD_WAIT_MIN_S`` real ones)."""
LOAD_WAIT_MIN_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--details", action="store_true", help="also list every request's outcome")
    parser.add_argument("--timeout", type=float, default=20.0, metavar="S", help="per-request client timeout")
    parser.add_argument("--part", choices=PARTS, default="all",
                        help="one-model: six users on one model; three-models: users switching between three models "
                        "that don't fit together, a foreign process halfway; all (default): both")


class KvgateInFront:
    """The demo's gateway factory: ``async with front(sim_url) as url`` runs a kvgate on 127.0.0.1 in front of the
    simulator (Ollama kind, ``parallel`` slots, the simulator's GPU exporter as its ``vram`` source); ``overrides``
    are more settings (``residency={...}``). ``counts`` reads the running kvgate's own loads and unloads."""

    def __init__(self, *, parallel: int = 2, cpu_offload: str = "auto", **overrides: Any) -> None:
        self._parallel = parallel
        self._cpu_offload = cpu_offload
        self._overrides = overrides
        self._app: web.Application | None = None

    @contextlib.asynccontextmanager
    async def __call__(self, sim_url: str) -> AsyncIterator[str]:
        from kvsim.gpu.exporter import EXPORTER_PATH

        backend = {"name": "sim", "kind": "ollama", "url": sim_url, "parallel": self._parallel,
                   "vram": sim_url + EXPORTER_PATH, "cpu_offload": self._cpu_offload}  # fmt: skip
        # The backend is the demo's own simulator: KVGATE_BACKEND__* (`docker run -e KVGATE_BACKEND__URL=...`, the
        # compose files) would point it elsewhere, and `kvgate demo` run in that container would fail every request.
        settings = load_settings(None, backends=[backend], backend=FirstBackendSettings(), **self._overrides)
        app = create_app(settings)
        runner, port = await start_server(app, "127.0.0.1", 0)
        self._app = app
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            self._app = None
            await runner.cleanup()

    def counts(self) -> tuple[int, int]:
        if self._app is None:
            raise RuntimeError("kvgate is not running")
        gate = self._app[LOADS]
        return gate.loads, gate.unloads


_kvgate_in_front = KvgateInFront(cpu_offload="off")  # the demo's simulator runs with llama.cpp's fit off


def multi_model_front(time_scale: float) -> KvgateInFront:
    """kvgate for the multi-model phase: its residency timings scaled to the simulator's time; the simulator runs
    with llama.cpp's fit off there (multi_model.py: a load that does not fit fails), and kvgate is told so."""
    residency = {"min_resident_s": MIN_RESIDENT_SIM_S / time_scale,
                 "load_wait_s": max(LOAD_WAIT_MIN_S, LOAD_WAIT_SIM_S / time_scale)}  # fmt: skip
    return KvgateInFront(residency=residency, cpu_offload="off")


class _Outcome(Protocol):
    @property
    def status(self) -> str: ...


class _Progress:
    LABELS = ("straight at the simulator", "through kvgate")

    def __init__(self, out: TextIO, title: str = "") -> None:
        self._out = out
        self._title = title
        self._run = 0
        self._started = time.monotonic()

    def __call__(self, done: int, total: int, outcome: _Outcome) -> None:
        if done == 1:
            self._run += 1
            label = self.LABELS[min(self._run, 2) - 1]
            self._out.write(f"\n{self._title}run {self._run}: {label}\n")
        mark = {"completed": ".", "trimmed": "t", "truncated": "T", "timed_out": "w", "refused": "r"}.get(
            outcome.status, "X")
        self._out.write(mark)
        if done == total:
            self._out.write(f"  {total} requests ({time.monotonic() - self._started:.0f} s)\n")
        self._out.flush()


async def run(args: argparse.Namespace, *, out: TextIO | None = None, sim_config: SimConfig | None = None,
              multi_model_config: SimConfig | None = None) -> int:  # fmt: skip
    """The demo (``_demo``), with only errors logged while it runs: the root logger's level is put back after, so a
    caller in the same process (a test) keeps its own."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        return await _demo(args, out=out, sim_config=sim_config, multi_model_config=multi_model_config)
    finally:
        root.setLevel(level)


async def _demo(args: argparse.Namespace, *, out: TextIO | None, sim_config: SimConfig | None,
                multi_model_config: SimConfig | None) -> int:  # fmt: skip
    """The demo; ``sim_config`` replaces the simulator's (default ``kvsim.workload.workload.demo_sim_config()``),
    e.g. a faster time scale or a ``tokenizer_cache_dir`` in tests. ``multi_model_config`` replaces the
    multi-model phase's (default ``multi_model.multi_model_sim_config()``, as many times faster as ``sim_config`` is
    than the demo's, with its tokenizer cache)."""
    from kvsim.workload import demo
    from kvsim.workload.multi_model import multi_model_sim_config
    from kvsim.workload.workload import demo_sim_config
    from kvsim.workload.workload_report import MULTI_MODEL_ROWS, render_comparison, render_outcomes

    out = out or sys.stdout
    part = getattr(args, "part", "all")
    out.write("kvgate demo: an Ollama on a simulated 24 GiB GPU (OLLAMA_NUM_PARALLEL=2); six users on one model in "
              "three phases,\nthen three models that don't fit together, users switching between them, a foreign "
              "process taking 8 GiB halfway\n"
              "legend: . completed  t trimmed (announced)  T silently truncated  X failed  r refused (503, "
              "Retry-After)  w still waiting\n")
    reports: list[RunReport] = []
    if part in ("all", "one-model"):
        direct, gated = await demo.compare(
            _kvgate_in_front, config=sim_config, progress=_Progress(out), timeout_s=args.timeout
        )
        reports += [direct, gated]
    if part in ("all", "three-models"):
        mm_config = multi_model_config
        if mm_config is None:
            mm_config = multi_model_sim_config()
            if sim_config is not None:
                speedup = sim_config.time_scale / demo_sim_config().time_scale
                mm_config = dataclasses.replace(mm_config, time_scale=mm_config.time_scale * speedup,
                                                tokenizer_cache_dir=sim_config.tokenizer_cache_dir)  # fmt: skip
        front = multi_model_front(mm_config.time_scale)
        mm_direct, mm_gated = await demo.compare_multi_model(
            front, gateway_counts=front.counts, config=mm_config, progress=_Progress(out, "three models, "),
            timeout_s=args.timeout,
        )
        reports += [mm_direct, mm_gated]
    title = "three models on 24 GiB, users switching, a foreign process takes 8 GiB halfway:"
    if part == "all":
        table = render_comparison(direct, gated, sections=[(title, mm_direct, mm_gated, MULTI_MODEL_ROWS)])
    elif part == "one-model":
        table = render_comparison(direct, gated)
    else:
        table = title + "\n" + render_comparison(mm_direct, mm_gated, MULTI_MODEL_ROWS)
    out.write("\n" + table + "\n")
    if args.details:
        for report in reports:
            out.write(f"\n{report.name}:\n{render_outcomes(report)}\n")
    return 0
