"""The one place a ``GatewayError`` becomes an HTTP response: in the dialect of the route it was asked on, with
``Retry-After`` where the error has one and the request's ``X-Request-ID`` where it has one.

    error_boundary     the outermost middleware: any handler (kvgate's own routes, the admin checks, the proxy's
                       edge) raises a GatewayError, and it is rendered here; aiohttp's own 404 and 405 join the tree
                       as NotFound and MethodNotAllowed, so they too answer in the route's format
    error_response     the same rendering for the callers that answer before or beside the handler: the proxy (its
                       log line and metrics need the status), the per-peer refusal, odd targets, the Expect check

An error after a stream's headers were sent is not rendered here: it is the stream's final event
(``dialects.stream_error_event``, in ``gateway.streaming``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway import dialects
from gateway.domain import Dialect
from gateway.edge.headers import error_headers
from gateway.edge.targets import route_dialect
from gateway.errors import GatewayError, MethodNotAllowed, NotFound
from gateway.support.safe_text import safe_text


def error_response(error: GatewayError, dialect: Dialect, *, request_id: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    """``error`` as a response in ``dialect``, with ``headers`` added."""
    headers = {**error_headers(error, request_id), **(headers or {})}
    return web.Response(status=error.status, body=dialects.error_body(dialect, error), content_type="application/json",
                        headers=headers)


@web.middleware
async def error_boundary(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except GatewayError as error:
        return error_response(error, route_dialect(request))
    except web.HTTPMethodNotAllowed as exc:
        allowed = tuple(sorted(exc.allowed_methods))
        where = safe_text(f"{request.method} {request.raw_path}")
        return error_response(MethodNotAllowed(f"{where}: method not allowed; allowed: {', '.join(allowed)}",
                                               allowed), route_dialect(request))
    except web.HTTPNotFound:
        return error_response(NotFound(f"{safe_text(request.method + ' ' + request.raw_path)}: no such route"),
                              route_dialect(request))
