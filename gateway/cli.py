"""``kvgate``: the command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from gateway import __version__, demo_cli
from gateway.config import ConfigError, Settings, load_settings, parse_backend_flag
from gateway.memory import estimate_cli
from gateway.observability.logs import configure_logging
from gateway.sim.runner import add_sim_arguments, run_sim_forever, sim_config_from_args

log = logging.getLogger("gateway")


def _serve_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the gateway in front of one or more LLM servers")
    serve.add_argument("--config", type=Path, help="TOML settings file (see config/kvgate.toml)")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 11435)")
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
    sim = sub.add_parser("sim", help="run the simulated GPU backend (an Ollama or llama-server) alone")
    add_sim_arguments(sim)
    demo = sub.add_parser("demo", help="a multi-user workload on the simulated GPU, straight and through kvgate")
    demo_cli.add_arguments(demo)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    if server:
        overrides["server"] = server
    if args.backend:
        overrides["backends"] = [parse_backend_flag(value, index) for index, value in enumerate(args.backend)]
    return load_settings(args.config, **overrides)


async def serve(settings: Settings) -> None:
    from gateway.app import create_app, start_server

    runner, port = await start_server(create_app(settings), settings.server.host, settings.server.port)
    backends = ", ".join(f"{b.name} ({b.kind}) {b.url}" for b in settings.backends)
    log.info("kvgate %s listening on http://%s:%d; backends: %s", __version__, settings.server.host, port, backends)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await runner.cleanup()


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop where it is installed (it roughly halves the proxy's CPU per chunk), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        try:
            settings = settings_from_args(args)
        except ConfigError as exc:
            print(f"kvgate: {exc}", file=sys.stderr)
            return 2
        configure_logging(settings.server.log_level, settings.server.log_format)
        run_event_loop(serve(settings))
        return 0
    if args.command == "estimate":
        return asyncio.run(estimate_cli.run(args))
    if args.command == "sim":
        configure_logging("info", "text")
        run_event_loop(run_sim_forever(sim_config_from_args(args), args.host, args.port))
        return 0
    if args.command == "demo":
        return asyncio.run(demo_cli.run(args))
    return 2


if __name__ == "__main__":
    sys.exit(main())
