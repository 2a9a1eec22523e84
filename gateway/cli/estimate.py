"""`kvgate estimate MODEL`: load cost, verdict and limits for a preset, a GGUF file or a model on a backend.

The lead's CLI registers it:  add_arguments(subparser); subparser.set_defaults(run=run); exit = asyncio.run(run(ns))
Exit status: 0 fits (or no VRAM reading to judge), 1 does not fit, 2 bad input or unreachable source.
With an Ollama --backend, /api/ps says which models are loaded (``residency``): a loaded model's own VRAM counts as
available to it (and its loaded context is the default), and for any model the output says whether a load would
need other models unloaded first.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TextIO

import aiohttp
import orjson

from gateway.backends.client import BackendClient
from gateway.backends.prober import ProbeError, detect_backend
from gateway.backends.vram_exporter import ExporterSource
from gateway.loads.standing import (
    Residency,
    calibration_for,
    plan_unload,
    residency,
    residency_json,
    residency_lines,
    residency_warnings,
)
from gateway.memory.estimate_table import format_bytes, render_table
from gateway.memory.fit_estimate import Estimate, VramRoom, estimate
from gateway.memory.host_ram import RamCheck, ram_check, read_host_ram
from gateway.memory.kv import ALLOWED_CACHE_TYPES, CacheType, ShapeError, parse_cache_type
from gateway.memory.load_cost import RunKnobs
from gateway.memory.presets import find_preset, preset_names, preset_profile
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.gguf_file import profile_from_gguf
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.memory.vram import StaticVramSource, VramReading, VramUnavailable, parse_size
from gateway.memory.vram_nvml import nvml_source
from gateway.runtimes import runtime_for

DEFAULT_CONTEXT_TOKENS = 8192


class InputError(Exception):
    """Raised for a model, size or option the command cannot use; the message says what would work."""


def _cache_type(text: str) -> CacheType:
    try:
        return parse_cache_type(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help=f"a preset ({', '.join(preset_names())}), a GGUF path, or a model name "
                        "on --backend (llama-server: any name, it serves one model)")
    parser.add_argument("--backend", metavar="URL", help="Ollama or llama-server base URL to ask for the model")
    parser.add_argument("--context", type=int, metavar="TOKENS",
                        help=f"tokens per sequence (default: the backend's, else {DEFAULT_CONTEXT_TOKENS})")
    parser.add_argument("--parallel", type=int, metavar="N", help="parallel sequences (default: the backend's, else 1)")
    parser.add_argument("--unified", action="store_true", help="one KV pool of --context tokens shared by all slots")
    parser.add_argument("--cache-type-k", "-ctk", type=_cache_type, default=CacheType.F16,
                        help=f"K cache type: {ALLOWED_CACHE_TYPES}")
    parser.add_argument("--cache-type-v", "-ctv", type=_cache_type, default=CacheType.F16,
                        help=f"V cache type: {ALLOWED_CACHE_TYPES}")
    parser.add_argument("--quantization", help="weights of a preset: Q4_K_M (default), Q8_0 or F16")
    parser.add_argument("--vram", default="auto", metavar="SIZE|nvml|URL|auto",
                        help="VRAM size such as 24GiB, 'nvml', a Prometheus exporter URL, or 'auto' "
                             "(NVML when available, else no verdict)")
    parser.add_argument("--overhead", type=_size, default=0, metavar="SIZE",
                        help="bytes to add for the runtime (CUDA context, pools), e.g. 512MiB")
    parser.add_argument("--ubatch", type=int, default=512, help="llama.cpp -ub (default 512)")
    parser.add_argument("--no-flash-attn", action="store_true", help="estimate compute without flash attention")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


async def _backend_profile(
    session: aiohttp.ClientSession, url: str, model: str
) -> tuple[ModelProfile, list[LoadedModel] | None]:
    """The model's profile and, from Ollama, every model /api/ps shows loaded (None: llama-server, or /api/ps
    unreadable)."""
    client = BackendClient(session, url)
    return await runtime_for(await detect_backend(client)).unconfigured_profile(client, model)


def _local_profile(model: str, quantization: str | None) -> ModelProfile:
    if model.endswith(".gguf") or Path(model).is_file():
        if not Path(model).is_file():
            raise InputError(f"no GGUF file at {model}")
        return profile_from_gguf(model)
    if find_preset(model):
        return preset_profile(model, quantization)
    raise InputError(f"{model!r} is not a preset ({', '.join(preset_names())}), not a GGUF file, "
                     "and no --backend URL was given to ask")


async def resolve_profile(args: argparse.Namespace, session: aiohttp.ClientSession) -> ModelProfile:
    """The profile for args.model: from --backend, else a GGUF file, else a preset."""
    return (await resolve_model(args, session))[0]


async def resolve_model(
    args: argparse.Namespace, session: aiohttp.ClientSession
) -> tuple[ModelProfile, list[LoadedModel] | None]:
    """The profile for args.model, and the models an Ollama --backend has loaded (None when not known)."""
    if args.backend:
        return await _backend_profile(session, args.backend, args.model)
    return await asyncio.to_thread(_local_profile, args.model, args.quantization), None


async def read_vram(spec: str, session: aiohttp.ClientSession) -> VramReading | None:
    if spec.startswith(("http://", "https://")):
        return await ExporterSource(session, spec).read()
    if spec in ("nvml", "auto"):
        try:
            source = nvml_source()
            try:
                return await source.read()
            finally:
                source.close()
        except VramUnavailable:
            if spec == "nvml":
                raise
            return None
    return await StaticVramSource(parse_size(spec)).read()


def _default_context(profile: ModelProfile) -> int:
    return min(DEFAULT_CONTEXT_TOKENS, profile.shape.n_ctx_train or DEFAULT_CONTEXT_TOKENS)


def ram_line(check: RamCheck) -> str | None:
    """The system-RAM line printed when the load offloads to the CPU (None when nothing spills)."""
    spill = check.offload
    if spill is None or not spill.offloaded:
        return None
    available = format_bytes(check.host.available_bytes) if check.host else "unknown"
    verdict = check.verdict.value if check.verdict else "unknown"
    return (f"system RAM: {format_bytes(spill.ram_bytes)} for {spill.cpu_layers} of {spill.n_layers} layers "
            f"offloaded to the CPU, {available} available: {verdict} ({check.note})")


def _print(result: Estimate, resident: Residency | None, as_json: bool, out: TextIO) -> None:
    plan = plan_unload(resident, result) if resident else None
    ram = ram_check(result, read_host_ram)
    ram_warning = ram.warning()
    if as_json:
        body = result.to_json()
        body.update(residency_json(resident, plan))
        body.update(ram.to_json())
        body["warnings"] += [*residency_warnings(resident, plan), *([ram_warning] if ram_warning else [])]
        out.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        line = ram_line(ram)
        out.write("\n".join([render_table(result), *residency_lines(resident, plan), *([line] if line else [])])
                  + "\n")


async def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        async with aiohttp.ClientSession() as session:
            profile, loaded = await resolve_model(args, session)
            reading = await read_vram(args.vram, session)
        resident = residency(args.model, loaded) if loaded is not None else None
        own = resident.own if resident else None
        parallel = args.parallel or profile.parallel or 1
        result = estimate(
            profile,
            context=args.context
            or (own.context_tokens if own else None)
            or profile.context_tokens
            or _default_context(profile),
            parallel=parallel,
            knobs=RunKnobs(
                type_k=args.cache_type_k,
                type_v=args.cache_type_v,
                overhead_bytes=args.overhead,
                unified=args.unified,
                n_ubatch=args.ubatch,
                flash_attn=not args.no_flash_attn,
                calibration=calibration_for(
                    profile, own, parallel=parallel, type_k=args.cache_type_k, type_v=args.cache_type_v
                ),
            ),
            vram=VramRoom(
                total_bytes=reading.total_bytes if reading else None,
                free_bytes=reading.free_bytes if reading else None,
                resident_bytes=resident.resident_bytes if resident else 0,
            ),
        )
    except (InputError, ProbeError, VramUnavailable, ShapeError, ValueError, OSError) as exc:
        err.write(f"kvgate estimate: {exc}\n")
        return 2
    _print(result, resident, args.json, out)
    return 1 if result.fits is False else 0
