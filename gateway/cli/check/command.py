"""``kvgate check``: its arguments, and its run (gather -> diagnose -> render; optionally a support bundle)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from gateway.cli.check.backend_log import LogSettings, parse_backend_log
from gateway.cli.check.bundle import bundle_files, write_bundle
from gateway.cli.check.diagnose import diagnose
from gateway.cli.check.gather import Answers, longest_seen, read_backend
from gateway.cli.check.host import read_host
from gateway.cli.check.readings import BackendReadings, HostReadings, Known, Readings, unknown
from gateway.cli.check.report import EXIT_CANNOT_CHECK, exit_code, render_json, render_text
from gateway.cli.check.signatures import match_signatures
from gateway.config.settings import ConfigError, Settings, load_settings, parse_backend_flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, action="append",
                        help="kvgate's TOML settings (its backends and their vram source); repeatable, as for serve")
    parser.add_argument("--backend", action="append", default=[], metavar="[NAME:]KIND=URL",
                        help="the server to check instead of the config's backends (repeatable)")
    parser.add_argument("--vram", help="VRAM source for every backend: nvml, an exporter URL, or a size (24GiB)")
    parser.add_argument("--log", action="append", default=[], type=Path, metavar="FILE",
                        help="the backend's log: matched against the known OOM messages, and read for its "
                             "settings (slots, unified, cache types, flash attention, OLLAMA_*) (repeatable)")
    parser.add_argument("--error", action="append", default=[], metavar="TEXT",
                        help="an error message a client got (repeatable)")
    parser.add_argument("--kernel-log", type=Path, help="read OOM-killer lines from this file instead of dmesg")
    parser.add_argument("--prompt-tokens", type=int, metavar="N",
                        help="the longest prompt your clients send, in tokens (else taken from --log or /slots)")
    parser.add_argument("--gateway", metavar="URL",
                        help="a running kvgate: the longest prompts it has counted (its /kvgate/status; the admin "
                             "key from --admin-key or KVGATE_ADMIN_KEY)")
    parser.add_argument("--admin-key", help="kvgate's admin key for --gateway (default: $KVGATE_ADMIN_KEY)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--report", type=Path, metavar="PATH",
                        help="write a support bundle (a directory, or PATH.tar.gz) with secrets scrubbed")


def check_settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.backend:
        overrides["backends"] = [parse_backend_flag(value, index) for index, value in enumerate(args.backend)]
    settings = load_settings(args.config, **overrides)
    if args.vram:
        backends = [{**b.model_dump(exclude_unset=True), "vram": args.vram} for b in settings.backends]
        settings = load_settings(args.config, **{**overrides, "backends": backends})
    return settings


def _longest(args: argparse.Namespace, log: LogSettings, backends: list[BackendReadings],
             seen: tuple[int, str] | None = None) -> Known[int]:
    if args.prompt_tokens:
        return Known(args.prompt_tokens, "--prompt-tokens")
    in_slots = [s.n_tokens for b in backends for s in b.slots if s.n_tokens]
    candidates = [(log.longest_prompt_tokens, "--log"), (max(in_slots, default=None), "/slots now")]
    if seen is not None:
        candidates.append(seen)
    best = max(((n, where) for n, where in candidates if n), default=None)
    return Known(best[0], best[1]) if best else unknown()


async def gather(
    settings: Settings, args: argparse.Namespace, host: HostReadings
) -> tuple[Readings, Answers, list[str]]:
    texts = [path.read_text(encoding="utf-8", errors="replace") for path in args.log]
    log = parse_backend_log("\n".join(texts))
    matches = match_signatures([*texts, *args.error])
    answers = Answers()
    async with aiohttp.ClientSession() as session:
        backends = [await read_backend(session, config, log, answers) for config in settings.backends]
        seen = await longest_seen(session, args.gateway, args.admin_key or os.environ.get("KVGATE_ADMIN_KEY")) \
            if args.gateway else None
    readings = Readings(backends=tuple(backends), host=host, log_matches=matches,
                        logs_read=tuple(str(p) for p in args.log), longest_prompt=_longest(args, log, backends, seen))
    return readings, answers, [m.line for m in matches]


async def run(args: argparse.Namespace, *, host_reader: Callable[..., HostReadings] = read_host) -> int:
    try:
        settings = check_settings(args)
        for path in args.log:
            if not path.is_file():
                raise ConfigError(f"setting '--log' = '{path}' is invalid: no such file")
    except ConfigError as exc:
        print(f"kvgate: {exc}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    host = host_reader(dmesg=None, kern_logs=(args.kernel_log,)) if args.kernel_log else host_reader()
    readings, answers, lines = await gather(settings, args, host)
    findings = diagnose(readings)
    report, text = render_json(findings), render_text(findings)
    print(json.dumps(report, indent=2) if args.json else text)
    if args.report:
        written = write_bundle(args.report, bundle_files(settings, report, answers.by_path, text, lines))
        print(f"kvgate: support bundle written to {written}", file=sys.stderr)
    return exit_code(findings)
