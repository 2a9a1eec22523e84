"""The supervisor of ``kvgate serve --workers N`` (gateway/cli/workers.py) with stand-in workers: real processes,
a few lines of Python each, that say ``ready`` on their link and then end, hang or listen for signals as a test
scripts them. ``tests/e2e/test_serve_workers.py`` runs it with real kvgate workers."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from gateway.cli import workers
from gateway.cli.workers import Supervisor
from tests.support.poll import until

READY = "import socket, sys; link = socket.socket(fileno=int(sys.argv[2])); link.send(b'ready\\n')"


def stand_in(code: str) -> workers.Command:
    """Workers running ``code``, their index and link descriptor in ``sys.argv[1:]``."""
    def command(index: int, link_fd: int) -> list[str]:
        return [sys.executable, "-c", code, str(index), str(link_fd)]

    return command


async def test_a_worker_that_fails_to_start_stops_the_others_and_its_exit_code_is_the_supervisor_s(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = tmp_path / "started"
    started.mkdir()
    code = ("import sys, time, pathlib; i = int(sys.argv[1]); pathlib.Path(sys.argv[3], str(i)).touch()\n"
            "if i == 1: sys.exit(3)\n"
            "time.sleep(60)")  # never ready: stopped by the supervisor once worker 1 failed

    def command(index: int, link_fd: int) -> list[str]:
        return [*stand_in(code)(index, link_fd), str(started)]

    supervisor = Supervisor(command, 2, "http://127.0.0.1:1")
    assert await asyncio.wait_for(supervisor.run(), timeout=20) == 3
    started_names = {path.name for path in started.iterdir()}  # worker 0 may be stopped before it wrote its name
    assert "1" in started_names and started_names <= {"0", "1"}
    line = "kvgate: worker 2 of 2 did not start (exit 3; its error is above); no worker serves"
    assert line in capsys.readouterr().err


async def test_a_worker_that_keeps_dying_is_restarted_with_a_growing_delay(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "gateway")
    supervisor = Supervisor(stand_in(READY + "; import time; time.sleep(0.05)"), 1, "http://127.0.0.1:1")
    running = asyncio.ensure_future(supervisor.run())
    await until(lambda: caplog.text.count("restarting it in") >= 3, timeout_s=20)
    supervisor.stop()
    assert await asyncio.wait_for(running, timeout=20) == 0
    delays = [float(delay) for delay in re.findall(r"exited \(exit 0\) after [\d.]+ s; restarting it in ([\d.]+) s",
                                                   caplog.text)]
    assert delays[:3] == [0.5, 1.0, 2.0]
    assert caplog.text.count("worker 0 restarted (pid") >= 2


async def test_stop_ends_every_worker_and_run_returns_0(tmp_path: Path) -> None:
    stopped = tmp_path / "stopped"
    code = ("import signal, sys, time, pathlib\n"  # the handler is in place before the worker says it is ready
            "def end(*_): pathlib.Path(sys.argv[3] + sys.argv[1]).touch(); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, end)\n"
            + READY + "\ntime.sleep(60)")

    def command(index: int, link_fd: int) -> list[str]:
        return [*stand_in(code)(index, link_fd), str(stopped)]

    supervisor = Supervisor(command, 3, "http://127.0.0.1:1")
    running = asyncio.ensure_future(supervisor.run())
    await until(lambda: all(worker.ready for worker in supervisor._workers), timeout_s=20)
    supervisor.stop()
    assert await asyncio.wait_for(running, timeout=20) == 0
    assert _all_exist(f"{stopped}{index}" for index in range(3))  # each got SIGTERM, none was killed


async def test_a_worker_not_ready_in_time_is_killed_and_the_start_fails(capsys: pytest.CaptureFixture[str]) -> None:
    supervisor = Supervisor(stand_in("import time; time.sleep(60)"), 1, "http://127.0.0.1:1", start_wait_s=0.3)
    assert await asyncio.wait_for(supervisor.run(), timeout=20) == workers.EXIT_WORKER_FAILED
    assert "worker 1 of 1 did not start (killed by SIGKILL); no worker serves" in capsys.readouterr().err


async def test_a_worker_that_ignores_sigterm_is_killed_after_the_stop_wait(caplog: pytest.LogCaptureFixture) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + READY + "\ntime.sleep(60)"
    supervisor = Supervisor(stand_in(code), 1, "http://127.0.0.1:1", stop_wait_s=0.3)
    running = asyncio.ensure_future(supervisor.run())
    await until(lambda: supervisor._workers[0].ready, timeout_s=20)
    supervisor.stop()
    assert await asyncio.wait_for(running, timeout=20) == 0
    assert "did not stop within 0.3 s; killing it" in caplog.text


def _all_exist(paths: Iterable[str]) -> bool:
    return all(Path(path).exists() for path in paths)


def test_the_port_is_held_and_picked_for_the_workers() -> None:
    with workers.hold_port("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        assert port > 0
        with workers.hold_port("127.0.0.1", port):  # a second SO_REUSEPORT socket, as each worker's, may join
            pass
