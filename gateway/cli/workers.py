"""``kvgate serve --workers N``: N processes on one port, and the supervisor that keeps them running.

    kvgate serve --workers 2                   the supervisor: no app, no ledger; it holds the port and its workers
      ├─ kvgate serve ... --worker-index 0     web.TCPSite(reuse_port=True) ┐ one port (SO_REUSEPORT): the kernel
      └─ kvgate serve ... --worker-index 1     web.TCPSite(reuse_port=True) ┘ spreads new connections over them
                 └──────── [shared_ledger] in Redis: one KV budget, each worker a replica of its own ────────┘

Each worker is the same ``kvgate serve`` command line with two internal flags: its index and the descriptor of its
end of a socket pair with the supervisor. A worker writes ``ready`` on it once it listens; the supervisor's end
closing (the supervisor killed, even with SIGKILL) tells the worker to stop, so no worker outlives it. Workers run
in process groups of their own, so a terminal's Ctrl-C or hang-up reaches the supervisor alone, which passes it on:

    SIGTERM, SIGINT   SIGTERM to every worker, wait for them (SIGKILL after STOP_WAIT_S), exit 0
    SIGHUP            SIGHUP to every worker: each reloads the configuration (gateway/cli/hangups.py); one still
                      starting gets it once it is ready
    a worker dies     logged, restarted after a backoff (RESTART_MIN_S, doubling to RESTART_MAX_S; back to the
                      minimum once a worker has served STABLE_S)
    start-up fails    a worker that exits before it is ready: the others are stopped and the supervisor exits with
                      that worker's exit code (its own line on stderr said why), after one line naming the worker

The supervisor holds a socket bound to the port (SO_REUSEPORT, not listening: it gets no connections) from the
address check to its exit, so no other program takes the port between a worker's restarts; with ``port = 0`` that
socket picks the port every worker then listens on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.cli import hangups

log = logging.getLogger("gateway")

START_WAIT_S = 120.0
"""A worker not listening this long after it was started has failed to start (imports and tokenizers: ~1 s)."""
STOP_WAIT_S = 75.0
"""Workers still running this long after SIGTERM are killed (their own shutdown bounds in-flight requests)."""
RESTART_MIN_S = 0.5
RESTART_MAX_S = 30.0
STABLE_S = 30.0
"""A worker that served this long before it died is restarted after RESTART_MIN_S again."""
EXIT_WORKER_FAILED = 1
"""A worker failed to start without an exit code of its own (killed, or not ready within START_WAIT_S)."""

READY = b"ready\n"

Command = Callable[[int, int], Sequence[str]]
"""(worker index, descriptor of its end of the link) -> the worker's command line."""


@dataclass(frozen=True)
class WorkerRole:
    """What makes a ``kvgate serve`` process a worker: its index and its end of the link to the supervisor."""

    index: int
    link_fd: int


class SupervisorLink:
    """A worker's end of its socket pair with the supervisor."""

    def __init__(self, role: WorkerRole) -> None:
        self._sock = socket.socket(fileno=role.link_fd)
        self._sock.setblocking(False)

    def ready(self, loop: asyncio.AbstractEventLoop, on_gone: Callable[[], None]) -> None:
        """Tell the supervisor this worker listens; ``on_gone`` runs when the supervisor's end closes."""
        with contextlib.suppress(OSError):  # gone already: the reader below sees it
            self._sock.send(READY)

        def readable() -> None:
            try:
                if self._sock.recv(64):
                    return  # the supervisor writes nothing; were it to, it is not the end
            except BlockingIOError:
                return
            except OSError:
                pass
            loop.remove_reader(self._sock.fileno())
            log.warning("the supervisor of this worker is gone; stopping")
            on_gone()

        loop.add_reader(self._sock.fileno(), readable)

    def close(self) -> None:
        self._sock.close()


def hold_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``'s first address and ``port`` with SO_REUSEPORT (raises OSError as bind does): the
    workers join it, others can't take the port; its port is the one picked when ``port`` is 0."""
    family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def worker_command(argv: Sequence[str], port: int) -> Command:
    """A worker's command line: the supervisor's own, on the port it holds, with the worker's flags."""
    def command(index: int, link_fd: int) -> list[str]:
        return [sys.executable, "-m", "gateway", *argv, "--port", str(port),
                "--worker-index", str(index), "--worker-fd", str(link_fd)]

    return command


@dataclass
class Worker:
    """One worker slot: the process in it now (restarts replace it) and the supervisor's end of its link."""

    index: int
    process: asyncio.subprocess.Process | None = None
    link: socket.socket | None = None
    ready: bool = False
    started_s: float = 0.0
    hangup_pending: bool = False
    restart_delay_s: float = field(default=RESTART_MIN_S)

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit {returncode}"


class Supervisor:
    """Starts ``count`` workers, keeps them running, passes signals on; see the module docstring."""

    def __init__(self, command: Command, count: int, url: str, *, start_wait_s: float = START_WAIT_S,
                 stop_wait_s: float = STOP_WAIT_S) -> None:
        self._command = command
        self._start_wait_s, self._stop_wait_s = start_wait_s, stop_wait_s
        self._workers = [Worker(index) for index in range(count)]
        self._url = url
        self._stop = asyncio.Event()
        self._stopping = False

    def stop(self) -> None:
        """What SIGTERM and SIGINT do: stop every worker, and :meth:`run` returns 0."""
        self._stop.set()

    async def run(self) -> int:
        """0 once stopped by SIGTERM or SIGINT; a failed worker's exit code if they could not all start."""
        loop = asyncio.get_running_loop()
        handlers = ((signal.SIGINT, self.stop), (signal.SIGTERM, self.stop), (signal.SIGHUP, self._hangup))
        for sig, handler in handlers:
            loop.add_signal_handler(sig, handler)
        try:
            return await self._run(loop)
        finally:
            for sig, _ in handlers:
                loop.remove_signal_handler(sig)

    async def _run(self, loop: asyncio.AbstractEventLoop) -> int:
        if hangups.take_pending():  # a SIGHUP while the supervisor started: its workers reload once they listen
            self._hangup()
        stopped = asyncio.ensure_future(self._stop.wait())
        failed = await self._start_all(loop, stopped)
        if stopped.done():  # stopped while starting
            await self._stop_all()
            return 0
        if failed is not None:
            worker, code = failed
            await self._stop_all()
            print(f"kvgate: worker {worker.index + 1} of {len(self._workers)} did not start ({describe_exit(code)}"
                  f"{'; its error is above' if code > 0 else ''}); no worker serves", file=sys.stderr)
            return code if code > 0 else EXIT_WORKER_FAILED
        log.info("kvgate: %d workers listening on %s (supervisor pid %d; workers %s)", len(self._workers), self._url,
                 os.getpid(), ", ".join(str(worker.pid) for worker in self._workers))
        keepers = [loop.create_task(self._keep(worker)) for worker in self._workers]
        await stopped
        for keeper in keepers:
            keeper.cancel()
        await asyncio.gather(*keepers, return_exceptions=True)
        await self._stop_all()
        return 0

    async def _start_all(self, loop: asyncio.AbstractEventLoop,
                         stopped: asyncio.Future[Any]) -> tuple[Worker, int] | None:
        """Start every worker; the first that fails (and its exit code) as soon as it does, or None: all listen
        (or ``stopped`` came first: the caller stops them)."""
        starts: dict[asyncio.Future[Any], Worker] = {loop.create_task(self._start(w)): w for w in self._workers}
        pending: set[asyncio.Future[Any]] = set(starts)
        failed = None
        while pending and failed is None and not stopped.done():
            done, pending = await asyncio.wait(pending | {stopped}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopped)
            failed = next(((starts[task], task.result()) for task in done
                           if task is not stopped and task.result() is not None), None)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return failed

    async def _start(self, worker: Worker) -> int | None:
        """Start ``worker``'s process and wait until it listens: None, or the exit code it ended with before."""
        ours, theirs = socket.socketpair()
        try:
            worker.process = await asyncio.create_subprocess_exec(
                *self._command(worker.index, theirs.fileno()), pass_fds=(theirs.fileno(),), process_group=0,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        worker.link, worker.ready, worker.started_s = ours, False, time.monotonic()
        process = worker.process
        said = asyncio.ensure_future(asyncio.get_running_loop().sock_recv(ours, len(READY)))
        ended = asyncio.ensure_future(process.wait())
        try:
            done, _ = await asyncio.wait((said, ended), timeout=self._start_wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            said.cancel()
            ended.cancel()
        if said in done and said.exception() is None and said.result() == READY:
            worker.ready = True
            if worker.hangup_pending:
                worker.hangup_pending = False
                self._signal(worker, signal.SIGHUP)
            return None
        if process.returncode is None:  # not ready in time, or it closed its end of the link while it runs
            why = "closed its link" if said in done else f"did not start within {self._start_wait_s:g} s"
            log.error("worker %d (pid %d) %s; killing it", worker.index, process.pid, why)
            process.kill()
        code = await process.wait()
        self._drop_link(worker)
        return code

    async def _keep(self, worker: Worker) -> None:
        """Restart ``worker`` whenever it ends, after a backoff, until the supervisor stops."""
        while True:
            assert worker.process is not None
            code = await worker.process.wait()
            self._drop_link(worker)
            if self._stopping:
                return
            served_s = time.monotonic() - worker.started_s
            if worker.ready and served_s >= STABLE_S:
                worker.restart_delay_s = RESTART_MIN_S
            what = "exited" if worker.ready else "did not start"
            log.warning("worker %d (pid %d) %s (%s) after %.1f s; restarting it in %.1f s", worker.index,
                        worker.pid, what, describe_exit(code), served_s, worker.restart_delay_s)
            await asyncio.sleep(worker.restart_delay_s)
            worker.restart_delay_s = min(worker.restart_delay_s * 2, RESTART_MAX_S)
            if await self._start(worker) is None:
                log.info("worker %d restarted (pid %d)", worker.index, worker.pid)

    def _hangup(self) -> None:
        log.info("SIGHUP: reloading the configuration in every worker")
        for worker in self._workers:
            if worker.ready and worker.process is not None and worker.process.returncode is None:
                self._signal(worker, signal.SIGHUP)
            else:  # starting: it could die of a hang-up before it set its handler, so it gets it once it listens
                worker.hangup_pending = True

    def _signal(self, worker: Worker, sig: signal.Signals) -> None:
        if worker.process is not None and worker.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(sig)

    def _drop_link(self, worker: Worker) -> None:
        if worker.link is not None:
            worker.link.close()
            worker.link = None

    async def _stop_all(self) -> None:
        self._stopping = True
        log.info("stopping %d workers", len(self._workers))
        running = [worker.process for worker in self._workers
                   if worker.process is not None and worker.process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        waits = [asyncio.ensure_future(process.wait()) for process in running]
        if waits:
            _, late = await asyncio.wait(waits, timeout=self._stop_wait_s)
            for process in running:
                if process.returncode is None:
                    log.warning("worker pid %d did not stop within %g s; killing it", process.pid, self._stop_wait_s)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            if late:
                await asyncio.wait(late)
        for worker in self._workers:
            self._drop_link(worker)
