"""The listing routes (``/api/tags``, ``/api/ps``, ``/v1/models``): every backend's list, fetched together and
merged into one in the client's format; a backend that can't be reached is left out and named in
``X-Kvgate-Unreachable`` (503 when none answers)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import web

from gateway.backends import Backend, BackendRegistry, models
from gateway.backends.client import BackendCallError
from gateway.edge.routes import Route
from gateway.errors import BackendUnavailable
from gateway.support.hop_headers import REQUEST_ID

log = logging.getLogger("gateway.proxy")  # the request path's logger, as before this left proxy.py


async def _get_json(registry: BackendRegistry, backend: Backend, path: str) -> dict[str, Any]:
    if path == backend.runtime.list_path:
        return await registry.fetch_listing(backend)  # the one listing fetch: it keeps the model names
    return await backend.client.get_json(path)


async def merged_listing(
    registry: BackendRegistry, request: web.Request, route: Route, request_id: str
) -> web.Response:
    """``/api/tags``, ``/api/ps`` and ``/v1/models``: the lists of all backends, merged."""
    path = request.path
    backends = registry.backends
    if route.kind is not None:
        backends = [backend for backend in backends if backend.kind is route.kind] or [registry.default]
    fetch_path = path if path != "/api/tags" else None
    results = await asyncio.gather(
        *(_get_json(registry, b, fetch_path or b.runtime.list_path) for b in backends), return_exceptions=True
    )
    groups: list[list[dict[str, Any]]] = []
    unreachable: list[str] = []
    for backend, result in zip(backends, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, BackendCallError):
                raise result
            unreachable.append(backend.name)
            log.warning("could not list %s: %s", path, result.message)
            continue
        if path == "/v1/models":
            groups.append(models.as_openai_models(result))
        elif path == "/api/tags":
            groups.append(backend.runtime.ollama_tags(result))
        else:
            groups.append([entry for entry in result.get("models") or [] if isinstance(entry, dict)])
    if not groups:
        raise BackendUnavailable(f"no backend answered {path}; unreachable: {', '.join(unreachable)}")
    if path == "/v1/models":
        payload: dict[str, Any] = {"object": "list", "data": models.merge_unique(groups, "id")}
    else:
        payload = {"models": models.merge_unique(groups, "name")}
    headers = {REQUEST_ID: request_id}
    if unreachable:
        headers["X-Kvgate-Unreachable"] = ",".join(unreachable)
    return web.Response(body=orjson.dumps(payload), content_type="application/json", headers=headers)
