"""Starting the simulator: in a test (``start_sim``), from the CLI (``kvgate sim``: ``add_sim_arguments``,
``sim_config_from_args``, ``run_sim_forever``)."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys

from aiohttp import web

from kvsim.app import create_sim_app
from kvsim.catalog import CATALOG, DEFAULT_MODELS
from kvsim.clock import Clock
from kvsim.config import SimConfig
from kvsim.gpu.exporter import EXPORTER_PATH
from kvsim.ollama.godur import DurationError, parse_keep_alive

__all__ = ["SimConfig", "add_sim_arguments", "run_sim_forever", "sim_config_from_args", "start_sim"]


async def start_sim(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0, *, clock: Clock | None = None
) -> tuple[web.AppRunner, str]:
    """Serve a simulator; returns the runner (``await runner.cleanup()`` to stop) and its base URL."""
    runner = web.AppRunner(create_sim_app(config, clock=clock), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    return runner, f"http://{host}:{bound[1]}"


async def run_sim_forever(config: SimConfig, host: str = "127.0.0.1", port: int = 11434) -> None:
    runner, url = await start_sim(config, host, port)
    gpus = ", ".join(f"{size / 2**30:.0f} GiB" for size in config.gpu_bytes)
    print(f"kvgate sim: {config.mode} ({config.era}) on {url}, GPUs: {gpus}; GPU exporter at {url}{EXPORTER_PATH}",
          file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _duration(text: str) -> float:
    try:
        return parse_keep_alive(float(text) if text.lstrip("-").replace(".", "", 1).isdigit() else text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {f"{p}{s}": 1024 ** (i + 1) for i, p in enumerate("kmgt") for s in ("", "ib")}


def parse_size(text: str) -> int:
    """Bytes in '24GiB', '24 GB', '512M' (binary), '80000000000'."""
    match = _SIZE.match(text)
    unit = (match[2] or "").lower() if match else ""
    if match is None or unit not in _UNITS or float(match[1]) <= 0:
        raise ValueError(f"cannot read {text!r} as a GPU size; expected bytes or a number with KiB/MiB/GiB/TiB "
                         "(or K/M/G/T) or KB/MB/GB/TB, e.g. 24GiB")
    return round(float(match[1]) * _UNITS[unit])


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _span(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX tokens, e.g. 16:160; got {text!r}") from None


def add_sim_arguments(parser: argparse.ArgumentParser, *, include_address: bool = True) -> None:
    d = SimConfig()
    g = parser.add_argument_group("simulator")
    if include_address:
        g.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
        g.add_argument("--port", type=int, default=11434, help="port (default %(default)s; 0 = any free port)")
    g.add_argument("--mode", choices=("ollama", "llama-server"), default=d.mode, help="API to speak")
    g.add_argument(
        "--era",
        choices=("e3", "e2"),
        default=d.era,
        help="Ollama generation: e3 = v0.30+ (llama-server per model), e2 = v0.12.11-v0.29",
    )
    g.add_argument(
        "--gpu",
        type=_size,
        action="append",
        metavar="SIZE",
        help="a virtual GPU of SIZE (e.g. 24GiB); repeat for more GPUs (default one of 24GiB)",
    )
    g.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help=f"comma-separated catalog models (catalog: {', '.join(sorted(CATALOG))})",
    )
    g.add_argument("--num-parallel", type=int, default=d.num_parallel, help="OLLAMA_NUM_PARALLEL")
    g.add_argument(
        "--max-loaded-models", type=int, default=d.max_loaded_models, help="OLLAMA_MAX_LOADED_MODELS (0 = 3 per GPU)"
    )
    g.add_argument("--max-queue", type=int, default=d.max_queue, help="OLLAMA_MAX_QUEUE")
    g.add_argument(
        "--context-length",
        type=int,
        default=d.context_length,
        help="OLLAMA_CONTEXT_LENGTH (0 = by total VRAM: 4096, 32768 from 23 GiB, 262144 from 47 GiB)",
    )
    g.add_argument("--keep-alive", type=_duration, default=d.keep_alive_s, help="OLLAMA_KEEP_ALIVE (5m, 30s, -1)")
    g.add_argument("--kv-cache-type", default=d.kv_cache_type, help="OLLAMA_KV_CACHE_TYPE / -ctk -ctv")
    g.add_argument("--dynamic-kv", action="store_true", help="grow the KV cache per token (transformers-style)")
    g.add_argument(
        "--no-fit",
        action="store_true",
        help="LLAMA_ARG_FIT=off: E3's first model fails with out-of-memory instead of partly offloading to the CPU",
    )
    g.add_argument("--load-time", type=float, default=d.load_s, help="seconds a (re)load takes")
    g.add_argument("--prompt-speed", type=float, default=d.prompt_tokens_per_s, help="prompt tokens/s")
    g.add_argument("--gen-speed", type=float, default=d.gen_tokens_per_s, help="generated tokens/s per request")
    g.add_argument(
        "--response-tokens",
        type=_span,
        default=(d.min_response_tokens, d.max_response_tokens),
        metavar="MIN:MAX",
        help="length of the generated answers",
    )
    g.add_argument("--seed", type=int, default=d.seed, help="seed of the generated text")
    g.add_argument("--time-scale", type=float, default=d.time_scale, help="simulated seconds per real second")
    g.add_argument("--server-model", default=d.server_model, help="llama-server mode: the model")
    g.add_argument("--ctx-size", type=int, default=d.ctx_size, help="llama-server mode: -c (0 = trained context)")
    g.add_argument("--parallel", type=int, default=d.n_parallel, help="llama-server mode: -np (-1 = auto, 4)")
    g.add_argument(
        "--kv-unified",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="llama-server mode: -kvu / -no-kvu (default: unified exactly when -np is auto)",
    )
    g.add_argument("--embeddings", action="store_true",
                   help="llama-server mode: serve /embedding, /embeddings and /v1/embeddings (else they answer 501)")
    g.add_argument("--reranking", action="store_true",
                   help="llama-server mode: serve /rerank and its aliases (and embeddings, as the real flag does)")


def sim_config_from_args(args: argparse.Namespace) -> SimConfig:
    low, high = args.response_tokens
    return SimConfig(
        mode=args.mode,
        era=args.era,
        gpu_bytes=tuple(args.gpu or SimConfig().gpu_bytes),
        models=tuple(m.strip() for m in args.models.split(",") if m.strip()),
        num_parallel=args.num_parallel,
        max_loaded_models=args.max_loaded_models,
        max_queue=args.max_queue,
        context_length=args.context_length,
        keep_alive_s=args.keep_alive,
        kv_cache_type=args.kv_cache_type,
        dynamic_kv=args.dynamic_kv,
        llama_fit=not args.no_fit,
        load_s=args.load_time,
        prompt_tokens_per_s=args.prompt_speed,
        gen_tokens_per_s=args.gen_speed,
        min_response_tokens=low,
        max_response_tokens=high,
        seed=args.seed,
        time_scale=args.time_scale,
        server_model=args.server_model,
        ctx_size=args.ctx_size,
        n_parallel=args.parallel,
        kv_unified=args.kv_unified,
        embeddings=args.embeddings,
        reranking=args.reranking,
    )
