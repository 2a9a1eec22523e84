"""A fast fake Ollama for benchmarks: a small JSON chat answer, or a stream of N NDJSON chunks, as fast as it can.
Its one model is a Llama 3 (real tokenizer in /api/show, loaded in /api/ps), so kvgate's whole path runs.

Run: python -m bench.fake_upstream PORT
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

from gateway.support.gguf_reader import read_gguf_metadata

SMALL = orjson.dumps({
    "model": "bench", "created_at": "2026-11-29T00:00:00Z", "message": {"role": "assistant", "content": "hello"},
    "done": True, "done_reason": "stop", "prompt_eval_count": 12, "eval_count": 1,
})


def _chunk(index: int) -> bytes:
    return orjson.dumps({
        "model": "bench", "created_at": "2026-11-29T00:00:00Z",
        "message": {"role": "assistant", "content": f"token{index} "}, "done": False,
    }) + b"\n"


CHUNKS = [_chunk(index) for index in range(10_000)]


async def chat(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    if body.get("stream") is False:
        return web.Response(body=SMALL, content_type="application/json")
    count = int(body.get("options", {}).get("num_predict", 500))
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    for index in range(count):
        await response.write(CHUNKS[index % len(CHUNKS)])
    await response.write(SMALL + b"\n")
    await response.write_eof()
    return response


VOCAB = Path(__file__).resolve().parents[1] / "gateway" / "data" / "vocab" / "ggml-vocab-llama-bpe.gguf"


def _model_info() -> bytes:
    """Ollama's /api/show for a Llama 3 model: its GGUF key/values, the real tokenizer included (verbose)."""
    meta = read_gguf_metadata(VOCAB).values
    info = {key: value for key, value in meta.items() if key != "tokenizer.chat_template"}
    return orjson.dumps({
        "model_info": info, "details": {"format": "gguf", "family": "llama", "quantization_level": "Q4_K_M"},
        "capabilities": ["completion"], "parameters": "", "template": "",
    }, option=orjson.OPT_SERIALIZE_NUMPY)


SHOW = _model_info()


async def tags(request: web.Request) -> web.Response:
    return web.json_response({"models": [{"name": "bench:latest", "model": "bench:latest", "size": 1,
                                          "digest": "bench0"}]})


async def show(request: web.Request) -> web.Response:
    return web.Response(body=SHOW, content_type="application/json")


PS_DELAY_S = 0.0
"""How long /api/ps takes to answer (``--ps-delay-ms``; a busy or distant Ollama answers it in milliseconds)."""


async def ps(request: web.Request) -> web.Response:
    """The bench model is loaded with an 8K context, as Ollama's /api/ps shows it: kvgate plans against it."""
    if PS_DELAY_S:
        await asyncio.sleep(PS_DELAY_S)
    return web.json_response({"models": [{
        "name": "bench:latest", "model": "bench:latest", "size": 1, "size_vram": 1, "digest": "0",
        "details": {}, "expires_at": "2099-01-01T00:00:00Z", "context_length": 8192,
    }]})


async def version(request: web.Request) -> web.Response:
    """Ollama's /api/version (kvgate asks it once; a server without it is asked again at every pool probe)."""
    return web.json_response({"version": "0.30.0"})


def main() -> None:
    global PS_DELAY_S
    parser = argparse.ArgumentParser(description="An instant Ollama-shaped upstream for the benchmarks.")
    parser.add_argument("port", type=int)
    parser.add_argument("--ps-delay-ms", type=float, default=0.0, help="how long /api/ps takes to answer")
    args = parser.parse_args()
    PS_DELAY_S = args.ps_delay_ms / 1000
    app = web.Application()
    app.router.add_post("/api/chat", chat)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show)
    app.router.add_get("/api/version", version)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None, loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
