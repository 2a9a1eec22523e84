"""Admin access: who may reach kvgate's operator routes and the backends' model management, and the warning when
kvgate listens beyond this machine with nothing to tell clients apart.

With ``server.admin_key`` a request must carry it as a Bearer token (compared in constant time); without one, only
loopback clients may.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from pydantic import SecretStr

from gateway.config.settings import Settings
from gateway.edge.error_boundary import error_response
from gateway.edge.routes import Route
from gateway.errors import AdminOnly

log = logging.getLogger(__name__)

ProxiedHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
AdminKeyOf = Callable[[web.Request], SecretStr | None]


def admin_allowed(request: web.Request, admin_key: SecretStr | None) -> bool:
    """With an admin key: the request must carry it (compared in constant time). Without: loopback clients only."""
    if admin_key is None:
        remote = request.remote or ""
        try:
            return ipaddress.ip_address(remote).is_loopback
        except ValueError:
            return False
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, admin_key.get_secret_value().encode())


def require_admin(request: web.Request, admin_key: SecretStr | None) -> None:
    """Raises ``AdminOnly`` (403) unless ``admin_allowed``: the check of every operator route."""
    if not admin_allowed(request, admin_key):
        raise AdminOnly("this kvgate route needs the admin key (server.admin_key) as a Bearer token, or a loopback "
                        "client when none is set")


def admin_only(handler: ProxiedHandler, route: Route, admin_key_of: AdminKeyOf) -> ProxiedHandler:
    """Model management (Ollama's pull, push, create, copy, delete, blobs; llama-server's slot save, restore and erase,
    adapters, properties, model loads) only for the admin key, or for loopback clients when none is set; the admin key
    itself is not sent on to the backend. ``admin_key_of`` reads the key as configured now (a reload may change
    it)."""

    async def checked(request: web.Request) -> web.StreamResponse:
        admin_key = admin_key_of(request)
        if not admin_allowed(request, admin_key):
            what = f"{request.method} {route.path.split('{')[0].rstrip('/')} manages the backend's models or state"
            error = AdminOnly(
                f"{what} and needs kvgate's admin key (server.admin_key) as 'Authorization: Bearer <key>'"
                if admin_key is not None else
                f"{what}; with no server.admin_key set, only clients on kvgate's own machine may")
            log.warning("refused %s %s from %s: model management needs the admin key", request.method, route.path,
                        request.remote)
            return error_response(error, route.dialect)
        if admin_key is not None:
            headers = request.headers.copy()
            headers.popall("Authorization", None)
            request = request.clone(headers=headers)
        return await handler(request)

    return checked


def warn_if_exposed(settings: Settings) -> None:
    """A loud start-up warning when kvgate listens beyond this machine with nothing to tell clients apart."""
    server = settings.server
    if is_loopback_host(server.host):
        return
    has_keys = any(tenant.digests() for tenant in settings.tenants.values())
    if not has_keys and server.admin_key is None:
        log.warning(
            "SECURITY: kvgate listens on %s, beyond this machine, with no tenant API keys and no server.admin_key: "
            "anyone who can connect may run every model through it%s. Set [tenants.NAME] api_keys with "
            "server.require_api_key = true and a server.admin_key, or listen on 127.0.0.1 (README: Security)",
            server.host or "all interfaces",
            "" if server.admin_only_management else ", and pull, push, create, copy and delete models (and erase or "
            "restore llama-server's slots)",
        )
    elif not server.admin_only_management:
        log.warning("SECURITY: kvgate listens on %s with server.admin_only_management = false: every client may "
                    "pull, push, create, copy and delete models, and erase or restore llama-server's slots",
                    server.host or "all interfaces")


def is_loopback_host(host: str) -> bool:
    """Whether ``server.host`` keeps kvgate on this machine: a loopback address or ``localhost``."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
