"""The smallest streaming proxy aiohttp allows: the cost of one Python hop on this machine, with no kvgate logic.

The overhead benchmark measures it beside kvgate, so its table separates what kvgate adds from what any proxy
written with aiohttp (kvgate's own server and client) costs here. Body and status pass through; chunks are relayed
as they arrive, as kvgate relays them.

Run: python -m bench.bare_proxy PORT UPSTREAM_URL
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)


async def _session(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False) as session:
        app[SESSION] = session
        yield


def make_app(upstream: str) -> web.Application:
    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with request.app[SESSION].request(request.method, upstream + request.path_qs, data=body,
                                                headers=headers) as upstream_response:
            response = web.StreamResponse(status=upstream_response.status,
                                          headers={"Content-Type": upstream_response.headers["Content-Type"]})
            try:
                await response.prepare(request)
                while chunk := await upstream_response.content.readany():
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:  # the client left (a load generator stopping mid-request)
                pass
            return response

    app = web.Application()
    app.cleanup_ctx.append(_session)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="a bare aiohttp proxy on 127.0.0.1, for bench/overhead.py")
    parser.add_argument("port", type=int)
    parser.add_argument("upstream", help="the upstream's root URL, e.g. http://127.0.0.1:11434")
    args = parser.parse_args()
    web.run_app(make_app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port, print=None,
                access_log=None, loop=uvloop.new_event_loop())


if __name__ == "__main__":
    main()
