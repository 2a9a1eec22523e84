"""``kvgate demo``: the scripted multi-user workload against the simulated GPU, straight and then through kvgate.

Needs no GPU and no network: the simulator (an Ollama on a virtual 24 GiB GPU) and the gateway both run in this
process on 127.0.0.1. Ends with a side-by-side table. The gateway reads the simulated GPU as it reads a real one on
another host, through the exporter URL the simulator serves; the simulator (``kvsim``) is imported only when the
demo runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, TextIO

from gateway.app import create_app, start_server
from gateway.config import load_settings

if TYPE_CHECKING:
    from kvsim.config import SimConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--details", action="store_true", help="also list every request's outcome")
    parser.add_argument("--timeout", type=float, default=20.0, metavar="S", help="per-request client timeout")


@contextlib.asynccontextmanager
async def _kvgate_in_front(sim_url: str) -> AsyncIterator[str]:
    from kvsim.gpu.exporter import EXPORTER_PATH

    backend = {"name": "sim", "kind": "ollama", "url": sim_url, "parallel": 2, "vram": sim_url + EXPORTER_PATH}
    settings = load_settings(None, backends=[backend])
    runner, port = await start_server(create_app(settings), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class _Outcome(Protocol):
    @property
    def status(self) -> str: ...


class _Progress:
    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._run = 0
        self._started = time.monotonic()

    def __call__(self, done: int, total: int, outcome: _Outcome) -> None:
        if done == 1:
            self._run += 1
            label = "straight at the simulator" if self._run == 1 else "through kvgate"
            self._out.write(f"\nrun {self._run}: {label}\n")
        mark = {"completed": ".", "trimmed": "t", "truncated": "T", "timed_out": "w"}.get(outcome.status, "X")
        self._out.write(mark)
        if done == total:
            self._out.write(f"  {total} requests ({time.monotonic() - self._started:.0f} s)\n")
        self._out.flush()


async def run(args: argparse.Namespace, *, out: TextIO | None = None, sim_config: SimConfig | None = None) -> int:
    """The demo; ``sim_config`` replaces the simulator's (default ``kvsim.workload.workload.demo_sim_config()``),
    e.g. a faster time scale or a ``tokenizer_cache_dir`` in tests."""
    from kvsim.workload import demo
    from kvsim.workload.workload_report import render_comparison, render_outcomes

    out = out or sys.stdout
    logging.getLogger().setLevel(logging.ERROR)
    out.write("kvgate demo: an Ollama on a simulated 24 GiB GPU (OLLAMA_NUM_PARALLEL=2), six users, three phases\n"
              "legend: . completed  t trimmed (announced)  T silently truncated  X failed  w still waiting\n")
    direct, gated = await demo.compare(
        _kvgate_in_front, config=sim_config, progress=_Progress(out), timeout_s=args.timeout
    )
    out.write("\n" + render_comparison(direct, gated) + "\n")
    if args.details:
        out.write(f"\n{direct.name}:\n{render_outcomes(direct)}\n\n{gated.name}:\n{render_outcomes(gated)}\n")
    return 0
