"""A request on a connection past its client address's limit (``server.max_connections_per_peer``, counted in
``gateway.serving``): 429 with ``Retry-After`` in the route's dialect, and the connection closed after it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway import dialects
from gateway.errors import RateLimited
from gateway.targets import route_dialect


@web.middleware
async def refuse_over_peer_limit(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    why = getattr(request.protocol, "over_peer_limit", None)
    if not isinstance(why, str):
        return await handler(request)
    error = RateLimited(why, retry_after_s=1.0)
    response = web.Response(status=error.status, body=dialects.error_body(route_dialect(request), error),
                            content_type="application/json", headers={"Retry-After": "1"})
    response.force_close()
    return response
