"""The status page a person reads: ``GET /kvgate/`` (``/kvgate`` redirects there).

Three static files shipped in the package (``gateway/static/``: HTML, CSS, JavaScript; no build step, nothing
fetched from elsewhere). The page holds no data: its script reads ``/kvgate/status`` every two seconds, with the
admin key the person typed into its prompt (kept in the tab's ``sessionStorage``) as a Bearer token, so the page
itself is public and the data stays behind ``admin_allowed``. The script writes every value as text, and the
Content-Security-Policy lets the page run only kvgate's own script and talk only to kvgate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web

PAGE_PATH = "/kvgate/"
FILES = {"": ("status.html", "text/html"), "status.js": ("status.js", "text/javascript"),
         "status.css": ("status.css", "text/css")}
"""What ``/kvgate/<name>`` serves: a file of ``gateway/static`` and its type."""

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _read(name: str) -> bytes:
    return resources.files("gateway").joinpath("static", name).read_bytes()


def add_routes(router: web.UrlDispatcher, **route_options: Any) -> None:
    """``GET /kvgate/`` and its two assets (files read once, here), and the redirect from ``/kvgate``;
    ``route_options`` go to each ``add_get`` (the app's ``expect_handler``)."""
    for name, (filename, content_type) in FILES.items():
        router.add_get(PAGE_PATH + name, _serve(_read(filename), content_type), allow_head=True, **route_options)
    router.add_get(PAGE_PATH.rstrip("/"), _redirect, allow_head=True, **route_options)


def _serve(body: bytes, content_type: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=content_type, charset="utf-8", headers=SECURITY_HEADERS)

    return serve


async def _redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("kvgate/")  # relative: also right behind a reverse proxy that adds a path prefix
