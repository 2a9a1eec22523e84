"""kvgate's own routes under ``/kvgate/``: health, the live "what fits" estimate and token counts (the status report:
status.py).

Errors use OpenAI's error shape (the most common client), with the parameter named in ``param``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway import __version__, dialects
from gateway.backends import Backend, BackendRegistry
from gateway.backends.prober import ProbeError
from gateway.backends.probes import BackendProbes, local_profile
from gateway.edge.body.budget import BodyBudget
from gateway.edge.body.json_bound import decode_bounded
from gateway.edge.body.reader import read_body
from gateway.edge.routes import ROUTES
from gateway.errors import BackendUnavailable, BadRequest, MethodNotAllowed, NotFound
from gateway.loads.standing import (
    calibration_for,
    plan_unload,
    residency,
    residency_json,
    residency_warnings,
)
from gateway.memory.fit_estimate import VramRoom, estimate, parse_fit_params
from gateway.memory.host_ram import ram_check, read_host_ram
from gateway.memory.load_cost import Calibration, RunKnobs
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.memory.vram import VramReading, VramUnavailable
from gateway.runtimes import runtime_for
from gateway.tokens.prompt_counter import COUNTED_OPERATIONS, PromptCounter

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_TOKENS = 8192

Deps = Callable[[web.Request], tuple[BackendRegistry, BackendProbes]]
CountDeps = Callable[[web.Request], tuple[BackendRegistry, PromptCounter, BodyBudget]]
COUNTABLE_ROUTES = {route.path: route for route in ROUTES if route.operation in COUNTED_OPERATIONS}
WORKER = web.AppKey("worker", int)
"""Which of ``kvgate serve --workers N``'s processes this is (0 .. N-1); absent in a single process."""


async def health(request: web.Request) -> web.Response:
    worker = request.app.get(WORKER)
    if worker is None:
        return web.json_response({"status": "ok", "version": __version__})
    # which process answered, for an operator (or a test) checking that the port's connections are spread
    return web.json_response({"status": "ok", "version": __version__, "worker": {"index": worker, "pid": os.getpid()}})


def fit_handler(deps: Deps) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def fit(request: web.Request) -> web.Response:  # a GatewayError: rendered by gateway.edge.error_boundary
        registry, probes = deps(request)
        return await _fit(request, registry, probes)

    return fit


async def _fit(request: web.Request, registry: BackendRegistry, probes: BackendProbes) -> web.Response:
    query = request.query
    try:
        params = parse_fit_params(query)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    backend = await _backend(registry, query.get("backend"), params.model)
    profile = await _profile(probes, backend, params.model)
    reading, vram_warning = await _vram(probes, backend)
    settings = backend.settings
    loaded = await _loaded(probes, backend)
    resident = residency(params.model, loaded) if loaded is not None else None
    own = resident.own if resident else None
    calibration = _calibration(backend, profile, own)
    try:
        result = estimate(
            profile,
            context=params.context
            or (own.context_tokens if own else None)
            or profile.context_tokens
            or min(DEFAULT_CONTEXT_TOKENS, profile.shape.n_ctx_train or 8192),
            parallel=params.parallel or settings.parallel or profile.parallel or 1,
            knobs=RunKnobs(
                type_k=params.type_k if "cache_type_k" in query else settings.cache_type_k,
                type_v=params.type_v if "cache_type_v" in query else settings.cache_type_v,
                unified=bool(settings.unified_kv),
                calibration=calibration,
            ),
            vram=VramRoom(
                total_bytes=reading.total_bytes if reading else None,
                free_bytes=reading.free_bytes if reading else None,
                resident_bytes=resident.resident_bytes if resident else 0,
            ),
        )
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    plan = plan_unload(resident, result) if resident else None
    body = result.to_json()
    body.update(residency_json(resident, plan))
    body["calibrated_from"] = calibration.source if calibration else None
    body["backend"] = backend.name
    body["vram_source"] = reading.source if reading else None
    ram = ram_check(result, read_host_ram)
    body.update(ram.to_json())
    ram_warning = ram.warning()
    for warning in [*residency_warnings(resident, plan), *([vram_warning] if vram_warning else []),
                    *([ram_warning] if ram_warning else [])]:
        body.setdefault("warnings", []).append(warning)
    return web.json_response(body)


async def _backend(registry: BackendRegistry, name: str | None, model: str) -> Backend:
    if name is None:
        return await registry.resolve(model)
    try:
        return registry.by_name(name)
    except StopIteration:
        known = ", ".join(b.name for b in registry.backends)
        raise BadRequest(f"backend is {name!r}; known backends: {known}") from None


async def _profile(probes: BackendProbes, backend: Backend, model: str) -> ModelProfile:
    local = local_profile(model)
    try:
        return await probes.profile(backend, model)
    except (ProbeError, LookupError) as exc:
        if local is not None:
            return local
        raise BackendUnavailable(f"no profile for {model!r} from {backend.describe()}: {exc}") from None


def _calibration(backend: Backend, profile: ModelProfile, loaded: LoadedModel | None) -> Calibration | None:
    """For a model Ollama has loaded: scale the estimate to what /api/ps says the load really took."""
    if not runtime_for(backend).lists_loaded_models:
        return None
    settings = backend.settings
    return calibration_for(profile, loaded, parallel=settings.parallel or 1,
                           type_k=settings.cache_type_k, type_v=settings.cache_type_v)


async def _loaded(probes: BackendProbes, backend: Backend) -> list[LoadedModel] | None:
    """Ollama: every model /api/ps shows loaded (a burst of /kvgate/fit requests reads it once); None when the
    backend is not Ollama or /api/ps cannot be read."""
    if not runtime_for(backend).lists_loaded_models:
        return None
    try:
        return await probes.loaded_models(backend, join_running=True)
    except ProbeError:
        return None


async def _vram(probes: BackendProbes, backend: Backend) -> tuple[VramReading | None, str | None]:
    try:
        return await probes.vram(backend), None
    except VramUnavailable as exc:
        log.warning("VRAM reading unavailable for %s: %s", backend.describe(), exc)
        return None, f"no VRAM reading: {exc}"


def count_handler(
    deps: CountDeps, *, max_body_bytes: int, max_json_elements: int = 1_000_000
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """POST /kvgate/count?route=/api/chat with a request body as a client would send it to that route; its body
    read and held like a proxied one's (``server.max_body_bytes``, under ``server.max_held_body_bytes`` with every
    other body), its JSON elements bounded the same way (``server.max_json_elements``)."""

    async def count(request: web.Request) -> web.Response:
        registry, counter, bodies = deps(request)
        lease = bodies.lease()
        try:
            path = request.query.get("route", "/v1/chat/completions")
            route = COUNTABLE_ROUTES.get(path)
            if route is None:
                allowed = ", ".join(sorted(COUNTABLE_ROUTES))
                raise BadRequest(f"route is {path!r}; allowed: {allowed}")
            raw = await read_body(request, lease, max_bytes=max_body_bytes)
            body = await decode_bounded(raw, max_elements=max_json_elements)
            parsed = dialects.parse(route.dialect, route.operation, body, route.path)
            backend = await registry.resolve(parsed.model, route.kind)
            result = await counter.count(parsed, backend)
        finally:  # a GatewayError: rendered by gateway.edge.error_boundary
            lease.release()
        return web.json_response({
            "model": parsed.model, "backend": backend.name, "route": path,
            "prompt_tokens": result.tokens, "counter": result.counter, "exact": result.exact,
        })

    return count


async def unknown_kvgate_route(request: web.Request) -> web.Response:
    """``/kvgate/...`` is kvgate's own namespace: a path or method it does not serve is refused here (404, or 405
    with ``Allow``; rendered by the error boundary), never forwarded to a backend."""
    allowed = sorted({route.method for resource in request.app.router.resources()
                      if resource.get_info().get("path") == request.path for route in resource
                      if route.method != "HEAD"})
    if allowed:
        raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}; use {', '.join(allowed)}",
                               tuple(allowed))
    raise NotFound(f"kvgate has no route {request.path[:200]!r}; its own routes are /kvgate/ (the status page), "
                   "/kvgate/status, /kvgate/metrics, /kvgate/health, /kvgate/fit, /kvgate/count, /kvgate/tenants and "
                   "/kvgate/reload")
