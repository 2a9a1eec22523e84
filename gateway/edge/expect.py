"""The ``Expect`` header, on every route: ``100-continue`` is answered ``100 Continue``; anything else is a 417 in
the route's dialect (aiohttp's own handler turns a value with a non-UTF-8 byte into a 500 with a traceback).

Routes are added with ``expect_handler=expect_continue`` (``gateway.app``); aiohttp calls it before any
middleware, once the route is matched, so the route's dialect is known.
"""

from __future__ import annotations

from aiohttp import HttpVersion11, hdrs, web

from gateway.edge.error_boundary import error_response
from gateway.edge.targets import route_dialect
from gateway.errors import ExpectationFailed
from gateway.support.safe_text import safe_text

CONTINUE = "100-continue"
_SHOWN_CHARS = 64


def expect_problem(value: str) -> str | None:
    """What is wrong with an ``Expect`` value, None for ``100-continue`` (any case, spaces around it)."""
    if value.strip().lower() == CONTINUE:
        return None
    shown = safe_text(value[:_SHOWN_CHARS]).encode("ascii", "backslashreplace").decode("ascii")
    return (f"kvgate answers only Expect: {CONTINUE}; this request has Expect: \"{shown}\"; drop the header or "
            f"send {CONTINUE}")


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """aiohttp's expect handler: None to go on (after writing ``100 Continue``), or the 417 to answer."""
    value = request.headers.get(hdrs.EXPECT, "")
    problem = expect_problem(value)
    if problem is None:
        if request.version == HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        return None
    return error_response(ExpectationFailed(problem), route_dialect(request), headers={"Connection": "close"})
