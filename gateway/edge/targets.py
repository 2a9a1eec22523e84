"""Request targets kvgate forwards: origin-form paths only (RFC 9112 section 3.2.1).

An absolute-form target (``GET http://169.254.169.254/... HTTP/1.1``), the authority form, ``*`` and targets with
bytes outside printable ASCII, a fragment or a backslash are answered with a 400 in the route's dialect here,
before any handler runs, so none is ever joined onto a backend URL (``Backend.url_for`` builds from parts as well).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.domain import Dialect
from gateway.edge.routes import ROUTES, fallback_dialect
from gateway.errors import BadRequest
from gateway.support.safe_text import sanitize

log = logging.getLogger(__name__)

_ROUTE_DIALECTS = {route.path: route.dialect for route in ROUTES}
_ODD_CHARACTERS = frozenset("#\\")


def target_problem(target: str) -> str | None:
    """What is wrong with a raw request target, None when it is a plain origin-form path (and query)."""
    if not target.startswith("/"):
        return "the request target must be a path starting with '/'; absolute URLs, host:port and '*' are not forwarded"
    if not (target.isascii() and target.isprintable()) or " " in target:
        return "the request target must be printable ASCII; percent-encode other bytes"
    if _ODD_CHARACTERS.intersection(target):
        return "the request target must not hold '#' or '\\'; percent-encode them"
    return None


def route_dialect(request: web.Request) -> Dialect:
    """The dialect errors of this request are rendered in: its route's, kvgate's own routes OpenAI's, other paths
    by their prefix (as the proxy does)."""
    resource = request.match_info.route.resource
    canonical = resource.canonical if resource is not None else ""
    path = request.path or request.raw_path.split("?", 1)[0]  # CONNECT: matched no route, and has no path
    if canonical.startswith("/kvgate/") or path.startswith("/kvgate/"):
        return Dialect.OPENAI
    return _ROUTE_DIALECTS.get(canonical) or fallback_dialect(path)


@web.middleware
async def reject_odd_targets(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """400 for a target that is not an origin-form path; every other request goes on unchanged."""
    problem = target_problem(request.raw_path)
    if problem is None:
        return await handler(request)
    log.warning("refused request target %s: %s", sanitize(request.raw_path), problem)
    raise BadRequest(problem)  # rendered in the route's dialect by gateway.edge.error_boundary, the outer middleware
