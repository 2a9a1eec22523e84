"""A request on a connection past its client address's limit (``server.max_connections_per_peer``, counted in
``gateway.edge.serving``): 429 with ``Retry-After`` in the route's dialect, and the connection closed after it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.edge.error_boundary import error_response
from gateway.edge.targets import route_dialect
from gateway.errors import RateLimited


@web.middleware
async def refuse_over_peer_limit(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    why = getattr(request.protocol, "over_peer_limit", None)
    if not isinstance(why, str):
        return await handler(request)
    response = error_response(RateLimited(why, retry_after_s=1.0), route_dialect(request))
    response.force_close()
    return response
