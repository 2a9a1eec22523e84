"""A fast fake Ollama for benchmarks: a small JSON chat answer, or a stream of N NDJSON chunks, as fast as it can.

Run: python -m bench.fake_upstream PORT
"""

from __future__ import annotations

import sys

import orjson
import uvloop
from aiohttp import web

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


async def tags(request: web.Request) -> web.Response:
    return web.json_response({"models": [{"name": "bench:latest", "model": "bench:latest", "size": 1}]})


async def ps(request: web.Request) -> web.Response:
    """The bench model is loaded with an 8K context, as Ollama's /api/ps shows it: kvgate plans against it."""
    return web.json_response({"models": [{
        "name": "bench:latest", "model": "bench:latest", "size": 1, "size_vram": 1, "digest": "0",
        "details": {}, "expires_at": "2099-01-01T00:00:00Z", "context_length": 8192,
    }]})


def main() -> None:
    app = web.Application()
    app.router.add_post("/api/chat", chat)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None, loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
