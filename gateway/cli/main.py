"""``kvgate``: the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import functools
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from gateway import __version__
from gateway.admission.keyless import keyless_caps_line
from gateway.cli import demo as demo_cli
from gateway.cli import estimate as estimate_cli
from gateway.cli import hangups, workers
from gateway.cli.check import command as check_cli
from gateway.cli.config_watch import watch_files
from gateway.config.files import ConfigPaths, config_paths
from gateway.config.reload import Reloader, ReloadRefused
from gateway.config.reload_guard import refusing_empty_file
from gateway.config.settings import ConfigError, Settings, load_settings, parse_backend_flag, unknown_environment
from gateway.observability.logs import configure_logging
from gateway.support.tasks import stop as stop_task

log = logging.getLogger("gateway")

EXIT_CONFIG = 2
"""An invalid setting (named on stderr)."""
EXIT_ADDRESS_IN_USE = 3
"""``server.port`` is taken on ``server.host``."""
EXIT_HOST_UNRESOLVABLE = 4
"""``server.host`` is a name that does not resolve."""
EXIT_CANNOT_LISTEN = 5
"""Any other reason the address can't be listened on: not this machine's, a privileged port."""
EXIT_CACHE_DIR = 6
"""``counting.cache_dir`` can't be created or written."""


class StartupError(Exception):
    """kvgate can't start for a reason outside it: one line for stderr, and the exit code that tells it apart."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def check_cache_dir(path: Path) -> None:
    """Create ``counting.cache_dir`` and prove it writable, before anything listens."""
    directory = path.expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".kvgate-write-check-"):
            pass
    except OSError as exc:
        raise StartupError(f"setting 'counting.cache_dir' = '{path}' is unusable: {exc.strerror or exc}; make it a "
                           f"writable directory or choose another", EXIT_CACHE_DIR) from None


def _listen_error(host: str, port: int, exc: OSError) -> StartupError:
    where = f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return StartupError(f"setting 'server.host' = '{host}' does not resolve ({exc.strerror}); use an address "
                            f"such as 127.0.0.1 or a known host name", EXIT_HOST_UNRESOLVABLE)
    if exc.errno == errno.EADDRINUSE:
        return StartupError(f"can't listen on {where}: the port is already in use (another kvgate or server?); stop "
                            f"it or set another server.port", EXIT_ADDRESS_IN_USE)
    if exc.errno == errno.EADDRNOTAVAIL:
        reason = "the address is not one of this machine's; check server.host"
    elif exc.errno == errno.EACCES:
        reason = "permission denied (ports below 1024 need privileges); set another server.port"
    else:
        reason = exc.strerror or str(exc)
    return StartupError(f"can't listen on {where}: {reason}", EXIT_CANNOT_LISTEN)


def check_listen_address(host: str, port: int) -> None:
    """Resolve ``host`` and bind each of its addresses the way the server will (then let go), so that a busy port
    or an unknown host is one line at start-up rather than a traceback from inside the event loop."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise _listen_error(host, port, exc) from None
    for family, kind, proto, _, address in dict.fromkeys(infos):
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # a family this machine lacks; the server skips it too
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise _listen_error(host, port, exc) from None


def _serve_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the gateway in front of one or more LLM servers")
    serve.add_argument("--config", type=Path, action="append",
                       help="TOML settings file (see config/kvgate.toml); repeatable: the files are merged table by "
                       "table (backends in one, tenants' keys in another), a setting in two of them is an error")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 11435)")
    serve.add_argument("--workers", type=int, help="processes serving on the port (default 1); more than 1 needs "
                       "[shared_ledger] redis_url")
    # a worker of ``--workers N`` (gateway/cli/workers.py): set by its supervisor, never by hand
    serve.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument(
        "--backend", action="append", default=[], metavar="[NAME:]KIND=URL",
        help="a backend: URL, kind=URL or name:kind=URL; kind is ollama, llama-server or openai (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate", description="KV-cache-aware gateway for local LLM servers")
    parser.add_argument("--version", action="version", version=f"kvgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    estimate = sub.add_parser("estimate", help="what a model costs in VRAM at a context, and what fits")
    estimate_cli.add_arguments(estimate)
    # kvgate sim's own arguments are the simulator's: parsed in sim_command, so that nothing else loads kvsim
    sub.add_parser("sim", help="run the simulated GPU backend (an Ollama or llama-server) alone", add_help=False)
    demo = sub.add_parser("demo", help="a multi-user workload on the simulated GPU, straight and through kvgate")
    demo_cli.add_arguments(demo)
    check = sub.add_parser("check", help="diagnose out-of-memory trouble of a running Ollama or llama-server "
                           "(exit 0 ok, 1 warnings, 2 critical, 3 cannot check)")
    check_cli.add_arguments(check)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    if args.workers is not None:
        server["workers"] = args.workers
    if server:
        overrides["server"] = server
    if args.backend:
        overrides["backends"] = [parse_backend_flag(value, index) for index, value in enumerate(args.backend)]
    return load_settings(args.config, **overrides)


async def serve(settings: Settings, source: Callable[[], Settings] | None = None,
                worker: workers.WorkerRole | None = None, config: ConfigPaths = None) -> None:
    """Serve until SIGINT or SIGTERM; SIGHUP re-reads the configuration from ``source`` (gateway/config/reload.py),
    and so does a change of a ``config`` file with ``server.watch_config_s`` set (config_watch.py). ``worker``:
    serve as one of ``--workers N`` (gateway/cli/workers.py), on a port shared with the others."""
    from gateway.api.kvgate import WORKER
    from gateway.app import RELOADER, create_app, start_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    app = create_app(settings, settings_source=source)
    if worker is not None:
        app[WORKER] = worker.index
    reloads: set[asyncio.Task[None]] = set()

    def reload_on_hangup(trigger: str = "SIGHUP") -> None:
        task = loop.create_task(_reload_quietly(app[RELOADER], trigger))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    watching = None
    if settings.server.watch_config_s > 0 and config_paths(config):  # a changed file reloads as SIGHUP does
        watching = loop.create_task(watch_files(config_paths(config), settings.server.watch_config_s,
                                                lambda: reload_on_hangup("a --config file changed")))

    # before "listening": a signal sent on seeing that line is honoured
    for sig, handler in ((signal.SIGINT, stop.set), (signal.SIGTERM, stop.set), (signal.SIGHUP, reload_on_hangup)):
        with contextlib.suppress(NotImplementedError, AttributeError):  # AttributeError: no SIGHUP (Windows)
            loop.add_signal_handler(sig, handler)
    try:
        runner, port = await start_server(app, settings.server.host, settings.server.port,
                                          reuse_port=worker is not None)
    except OSError as exc:  # lost a race for the port since check_listen_address
        raise _listen_error(settings.server.host, settings.server.port, exc) from None
    backends = ", ".join(f"{b.name} ({b.kind}) {b.shown_url}" for b in settings.backends)
    who = "" if worker is None else f" worker {worker.index} (pid {os.getpid()})"
    log.info("kvgate %s%s listening on http://%s:%d; backends: %s", __version__, who, settings.server.host, port,
             backends)
    log.info("%s", keyless_caps_line(settings))  # which caps a request without a key runs with (README: Tenants)
    if hangups.take_pending():  # a SIGHUP while kvgate started (gateway/cli/hangups.py): the reload it asked for, now
        reload_on_hangup()
    link = None if worker is None else workers.SupervisorLink(worker)
    if link is not None:
        link.ready(loop, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        if link is not None:
            link.close()
        await stop_task(watching)
        for task in list(reloads):
            await task  # a reload in progress finishes (or fails) before the app it changes is torn down
        await runner.cleanup()


async def _reload_quietly(reloader: Reloader, trigger: str) -> None:
    """SIGHUP's reload (or a changed file's): its outcome is logged by the reloader (INFO, or ERROR naming the
    setting)."""
    with contextlib.suppress(ReloadRefused):
        await reloader.reload(trigger)


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop where it is installed (it roughly halves the proxy's CPU per chunk), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def serve_command(args: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    """``kvgate serve``: a bad setting or an address or directory it can't use is one line on stderr and its own
    exit code, never a traceback. With ``server.workers`` above 1 this process is the workers' supervisor, and
    ``argv`` (its command line) is theirs."""
    worker = None if args.worker_fd is None else workers.WorkerRole(args.worker_index or 0, args.worker_fd)
    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"kvgate: {exc}", file=sys.stderr)
        for line in unknown_environment(os.environ):
            print(f"kvgate: {line}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(settings.server.log_level, settings.server.log_format)
    if worker is None:  # a worker's supervisor said it already
        for line in unknown_environment(os.environ):
            log.warning("%s", line)
    try:
        check_cache_dir(settings.counting.cache_dir)
        if worker is None:  # a worker's port is held by its supervisor, which checked it
            check_listen_address(settings.server.host, settings.server.port)
        if worker is None and settings.server.workers > 1:
            return supervise(settings, argv)
        run_event_loop(serve(settings, refusing_empty_file(args.config, functools.partial(settings_from_args, args)),
                             worker, args.config))
    except StartupError as exc:
        print(f"kvgate: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def supervise(settings: Settings, argv: Sequence[str]) -> int:
    """``kvgate serve --workers N``: start N workers on the port, keep them running (gateway/cli/workers.py)."""
    host, port = settings.server.host, settings.server.port
    if not hasattr(socket, "SO_REUSEPORT") or sys.platform != "linux":  # elsewhere it does not spread connections
        raise StartupError(f"setting 'server.workers' = {settings.server.workers} needs Linux (SO_REUSEPORT); run "
                           f"one worker here", EXIT_CONFIG)
    try:
        held = workers.hold_port(host, port)
    except OSError as exc:
        raise _listen_error(host, port, exc) from None
    with held:
        port = held.getsockname()[1]
        supervisor = workers.Supervisor(workers.worker_command(argv, port), settings.server.workers,
                                        f"http://{host}:{port}")
        return asyncio.run(supervisor.run())


def sim_command(argv: Sequence[str]) -> int:
    """``kvgate sim``: the simulator alone (imported here: the gateway itself never loads it)."""
    from kvsim.runner import add_sim_arguments, run_sim_forever, sim_config_from_args

    parser = argparse.ArgumentParser(prog="kvgate sim", description="a simulated GPU host running Ollama or "
                                     "llama-server; its GPU is exported at <url>/sim/metrics for kvgate's vram")
    add_sim_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging("info", "text")
    run_event_loop(run_sim_forever(sim_config_from_args(args), args.host, args.port))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = parser.parse_known_args(argv)
    if args.command != "serve":
        hangups.release()  # only serve reloads on SIGHUP; for the others it ends them, as it would have
    if args.command == "sim":
        return sim_command(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "serve":
        return serve_command(args, argv)
    if args.command == "estimate":
        return asyncio.run(estimate_cli.run(args))
    if args.command == "demo":
        return asyncio.run(demo_cli.run(args))
    if args.command == "check":
        return asyncio.run(check_cli.run(args))
    return 2


if __name__ == "__main__":
    sys.exit(main())
