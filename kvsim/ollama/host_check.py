"""Ollama's ``allowedHostsMiddleware`` (``server/routes.go``) and its 404 page.

When Ollama listens on a loopback address it answers **403 with an empty body** unless the request's Host is
empty, ``localhost``, a loopback / private / unspecified IP, the machine's hostname, or a name ending in
``.localhost``, ``.local`` or ``.internal``: a proxy must send an upstream-appropriate Host. Unknown paths get
gin's ``404 page not found``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_SUFFIXES = (".localhost", ".local", ".internal")


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host: str) -> bool:
    name = _hostname(host.strip()).lower()
    if name in ("", "localhost", socket.gethostname().lower()) or name.endswith(_SUFFIXES):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_unspecified


@web.middleware
async def ollama_edge(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not request.path.startswith("/sim/") and not host_allowed(request.headers.get("Host", "")):
        return web.Response(status=403)
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return web.Response(status=404, text="404 page not found", content_type="text/plain")
