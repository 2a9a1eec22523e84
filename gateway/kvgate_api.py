"""kvgate's own routes under ``/kvgate/``: health, the live "what fits" estimate and token counts.

Errors use OpenAI's error shape (the most common client), with the parameter named in ``param``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway import __version__, dialects
from gateway.backends import Backend, BackendRegistry
from gateway.counting import COUNTED_OPERATIONS, Counting
from gateway.domain import BackendKind, Dialect
from gateway.errors import BackendUnavailable, BadRequest, GatewayError
from gateway.knowledge import Knowledge, local_profile
from gateway.memory.estimate import estimate, parse_fit_params
from gateway.memory.kv import parse_cache_type
from gateway.memory.load_cost import Calibration, calibrate_from_ps, estimate_load_cost
from gateway.memory.prober import ProbeError
from gateway.memory.profile import ModelProfile
from gateway.memory.vram import VramReading, VramUnavailable
from gateway.routes import ROUTES

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_TOKENS = 8192

Deps = Callable[[web.Request], tuple[BackendRegistry, Knowledge]]
CountDeps = Callable[[web.Request], tuple[BackendRegistry, Counting]]
COUNTABLE_ROUTES = {route.path: route for route in ROUTES if route.operation in COUNTED_OPERATIONS}


def _error(error: GatewayError) -> web.Response:
    return web.Response(status=error.status, body=dialects.error_body(Dialect.OPENAI, error),
                        content_type="application/json")


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "version": __version__})


def fit_handler(deps: Deps) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def fit(request: web.Request) -> web.Response:
        registry, knowledge = deps(request)
        try:
            return await _fit(request, registry, knowledge)
        except GatewayError as exc:
            return _error(exc)

    return fit


async def _fit(request: web.Request, registry: BackendRegistry, knowledge: Knowledge) -> web.Response:
    query = request.query
    try:
        params = parse_fit_params(query)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    backend = await _backend(registry, query.get("backend"), params.model)
    profile = await _profile(knowledge, backend, params.model)
    reading, vram_warning = await _vram(knowledge, backend)
    settings = backend.settings
    calibration = await _calibration(knowledge, backend, params.model, profile)
    try:
        result = estimate(
            profile,
            context=params.context or profile.context_tokens or min(DEFAULT_CONTEXT_TOKENS,
                                                                     profile.shape.n_ctx_train or 8192),
            parallel=params.parallel or settings.parallel or profile.parallel or 1,
            type_k=params.type_k if "cache_type_k" in query else parse_cache_type(settings.cache_type_k),
            type_v=params.type_v if "cache_type_v" in query else parse_cache_type(settings.cache_type_v),
            vram_total_bytes=reading.total_bytes if reading else None,
            vram_free_bytes=reading.free_bytes if reading else None,
            unified=bool(settings.unified_kv),
            calibration=calibration,
        )
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    body = result.to_json()
    body["calibrated_from"] = calibration.source if calibration else None
    body["backend"] = backend.name
    body["vram_source"] = reading.source if reading else None
    if vram_warning:
        body.setdefault("warnings", []).append(vram_warning)
    return web.json_response(body)


async def _backend(registry: BackendRegistry, name: str | None, model: str) -> Backend:
    if name is None:
        return await registry.resolve(model)
    try:
        return registry.by_name(name)
    except StopIteration:
        known = ", ".join(b.name for b in registry.backends)
        raise BadRequest(f"backend is {name!r}; known backends: {known}") from None


async def _profile(knowledge: Knowledge, backend: Backend, model: str) -> ModelProfile:
    local = local_profile(model)
    try:
        return await knowledge.profile(backend, model)
    except (ProbeError, LookupError) as exc:
        if local is not None:
            return local
        raise BackendUnavailable(f"no profile for {model!r} from {backend.describe()}: {exc}") from None


async def _calibration(
    knowledge: Knowledge, backend: Backend, model: str, profile: ModelProfile
) -> Calibration | None:
    """For a model Ollama has loaded: scale the estimate to what /api/ps says the load really took."""
    if backend.kind is not BackendKind.OLLAMA:
        return None
    try:
        loaded = await knowledge.loaded_model(backend, model)
    except ProbeError:
        return None
    if loaded is None or not loaded.context_tokens or loaded.size_bytes <= 0:
        return None
    settings = backend.settings
    cost = estimate_load_cost(
        profile, context_tokens=loaded.context_tokens, parallel=settings.parallel or 1,
        type_k=parse_cache_type(settings.cache_type_k), type_v=parse_cache_type(settings.cache_type_v),
    )
    return calibrate_from_ps(cost, size_bytes=loaded.size_bytes, size_vram_bytes=loaded.size_vram_bytes)


async def _vram(knowledge: Knowledge, backend: Backend) -> tuple[VramReading | None, str | None]:
    try:
        return await knowledge.vram(backend), None
    except VramUnavailable as exc:
        log.warning("VRAM reading unavailable for %s: %s", backend.describe(), exc)
        return None, f"no VRAM reading: {exc}"


def count_handler(deps: CountDeps) -> Callable[[web.Request], Awaitable[web.Response]]:
    """POST /kvgate/count?route=/api/chat with a request body as a client would send it to that route."""

    async def count(request: web.Request) -> web.Response:
        registry, counting = deps(request)
        try:
            path = request.query.get("route", "/v1/chat/completions")
            route = COUNTABLE_ROUTES.get(path)
            if route is None:
                allowed = ", ".join(sorted(COUNTABLE_ROUTES))
                raise BadRequest(f"route is {path!r}; allowed: {allowed}")
            body = dialects.decode_body(await request.read())
            parsed = dialects.parse(route.dialect, route.operation, body, route.path)
            backend = await registry.resolve(parsed.model, route.kind)
            result = await counting.count(parsed, backend)
            if result is None:
                raise BackendUnavailable(f"no counter could count this request for {backend.describe()}")
        except GatewayError as exc:
            return _error(exc)
        return web.json_response({
            "model": parsed.model, "backend": backend.name, "route": path,
            "prompt_tokens": result.tokens, "counter": result.counter, "exact": result.exact,
        })

    return count
