"""kvgate's own routes under ``/kvgate/``: health, the live "what fits" estimate, token counts and usage per tenant.

Errors use OpenAI's error shape (the most common client), with the parameter named in ``param``.
"""

from __future__ import annotations

import html
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiohttp import web

from gateway import __version__, dialects
from gateway.admission import PoolKey, PoolSpec, QueueStats, WaitingRoom
from gateway.admission.pool_slots import SlotSource
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
from gateway.memory.fit_estimate import VramRoom, estimate, parse_fit_params, ram_check
from gateway.memory.host_ram import read_host_ram
from gateway.memory.load_cost import Calibration, RunKnobs
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.memory.vram import VramReading, VramUnavailable
from gateway.observability.outcomes import OutcomeTally
from gateway.observability.pool_layout import pool_label
from gateway.observability.tenant_usage import TenantUsage
from gateway.runtimes import runtime_for
from gateway.support.safe_text import safe_text
from gateway.tokens.prompt_counter import COUNTED_OPERATIONS, PromptCounter

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_TOKENS = 8192

Deps = Callable[[web.Request], tuple[BackendRegistry, BackendProbes]]
CountDeps = Callable[[web.Request], tuple[BackendRegistry, PromptCounter, BodyBudget]]
COUNTABLE_ROUTES = {route.path: route for route in ROUTES if route.operation in COUNTED_OPERATIONS}


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "version": __version__})


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


def tenants_snapshot(usage: TenantUsage, configured: Iterable[str], room: WaitingRoom) -> dict[str, object]:
    """``GET /kvgate/tenants``: each tenant's usage since start (observability/tenant_usage.py) and the sequences it
    holds in the KV pools now; no I/O."""
    active: Counter[str] = Counter()
    ledger = room.ledger
    for key in ledger.keys():  # noqa: SIM118 (a Ledger is no mapping)
        active.update(ledger.snapshot(key).per_tenant_active)
    return usage.snapshot(configured, active)


def status_snapshot(
    registry: BackendRegistry, room: WaitingRoom, pools: dict[tuple[str, str], PoolSpec], uptime_s: float,
    truncations: dict[str, Any] | None = None, notes: dict[str, list[str]] | None = None,
    *, gpus: list[dict[str, Any]] | None = None, routing: Callable[[str], dict[str, Any]] | None = None,
    slot_sources: Mapping[tuple[str, str], SlotSource] | None = None,
    outcomes: OutcomeTally | None = None,
) -> dict[str, Any]:
    """Backends (with ``notes``: why one is forwarded without admission, a configured context its loaded models
    disagree with), their models, every KV pool with its reservations and queue, the GPU ledger of each backend with
    a VRAM source (``observability.gpus.gpu_rows``), and the silent truncations seen in replies
    (``TruncationLog.snapshot()``), as JSON; with ``routing`` (``Router.status``), each backend's routing state:
    seconds it stays out after failing, why, outages and retries; with ``slot_sources`` (``SlotBook.sources``), where
    each pool's slot count came from (configured, inferred from /api/ps, reported by /props, assumed). With
    ``outcomes``, each pool's requests by outcome since start and the totals of every request
    (``observability/outcomes.py``). Every string that may come from a client or a backend is safe text
    (``gateway.support.safe_text``), so the page always encodes."""
    notes = notes or {}
    stats = room.stats()
    tally = outcomes or OutcomeTally()
    keys = {*(PoolKey(*key) for key in pools), *room.ledger.keys(), *stats, *tally.keys()}
    sources = slot_sources or {}
    pool_rows = [{**_pool_row(room, key, pools.get(key), stats.get(key), tally),
                  "slots_source": _slots_source(sources.get(key))} for key in sorted(keys)]
    return {
        "version": __version__,
        "uptime_s": round(uptime_s, 1),
        "backends": [
            {"name": b.name, "kind": str(b.kind), "url": b.settings.shown_url,  # a password masked
             "models": sorted(map(safe_text, b.models)),
             "last_error": b.last_error and safe_text(b.last_error),
             "notes": [safe_text(note) for note in notes.get(b.name, [])],
             **({} if routing is None else {"routing": _routing_row(routing(b.name))})}
            for b in registry.backends
        ],
        "pools": pool_rows,
        "outcomes": tally.total.to_json(),
        "gpus": gpus or [],
        "truncations": truncations or {"counts": [], "recent": []},
    }


def _pool_row(room: WaitingRoom, key: PoolKey, spec: PoolSpec | None, stat: QueueStats | None,
              tally: OutcomeTally) -> dict[str, Any]:
    """One pool: its layout, what it holds on every replica (``scope`` "shared", with a shared ledger) and this
    replica's part of it (``local``; its own reservations are ``sequences``), its queue here, and its requests by
    outcome since start."""
    total, here = room.pool_snapshot(key), room.ledger.snapshot(key)
    queued_here = stat.queued if stat else 0
    return {
        "backend": safe_text(key.backend), "model": safe_text(key.model),
        "kind": "unified" if spec and spec.unified else "split" if spec else None,
        "layout": pool_label(spec) if spec else None,
        "slots": spec.slots if spec else None,
        "slot_context_tokens": spec.slot_ctx_tokens if spec else None,
        "capacity_tokens": spec.pool_tokens if spec else None,
        "scope": "local" if room.shared is None else "shared",
        "active_sequences": total.active_sequences,
        "reserved_tokens": total.reserved_tokens,
        "local": {"active_sequences": here.active_sequences, "reserved_tokens": here.reserved_tokens},
        "other_replicas": {"active_sequences": max(0, total.active_sequences - here.active_sequences),
                           "reserved_tokens": max(0, total.reserved_tokens - here.reserved_tokens),
                           "queued": max(0, room.queue_length(key) - queued_here)},
        "sequences": [{"id": r.id, "tenant": safe_text(r.tenant), "tokens": r.tokens, "sequences": r.sequences}
                      for r in room.ledger.reservations(key)],
        "queued": queued_here,
        "oldest_wait_s": round(stat.oldest_waited_s, 3) if stat else 0.0,
        "waiting": [{"position": position, "tenant": safe_text(w.tenant), "priority": w.priority,
                     "waited_s": round(w.waited_s, 3), "reason": safe_text(w.reason)}
                    for position, w in enumerate(stat.waiters if stat else (), start=1)],
        **tally.pool(key).to_json(),
    }


def _routing_row(state: dict[str, Any]) -> dict[str, Any]:
    reason = state.get("out_reason")
    return {**state, "out_reason": None if reason is None else safe_text(str(reason))}


def status_html(status: dict[str, Any]) -> str:
    """The same, as a page a person can read."""
    def cells(values: list[Any], tag: str = "td") -> str:
        return "".join(f"<{tag}>{html.escape(safe_text(str(v)))}</{tag}>" for v in values)

    pool_columns = ["backend", "model", "layout", "slots_source", "capacity_tokens", "active_sequences",
                    "reserved_tokens", "queued", "oldest_wait_s", "admitted_total", "queued_total", "clamped_total",
                    "pinned_total", "trimmed_total", "summarized_total", "summary_failed_total", "refused_total"]
    backend_columns = [[b["name"], b["kind"], b["url"], ", ".join(b["models"]), _out_cell(b.get("routing")),
                        b["last_error"] or "", "; ".join(b["notes"])] for b in status["backends"]]
    backend_rows = "".join(f"<tr>{cells(row)}</tr>" for row in backend_columns)
    pool_rows = "".join(f"<tr>{cells([_pool_cell(p, c) for c in pool_columns])}</tr>"
                        for p in status["pools"])
    gpu_columns = ["backend", "source", "total_bytes", "models", "other_processes_bytes", "reserved_bytes",
                   "free_bytes", "overcommitted", "problem"]
    gpu_rows = "".join(f"<tr>{cells([_gpu_cell(g, c) for c in gpu_columns])}</tr>" for g in status.get("gpus", []))
    truncations = status["truncations"]
    count_rows = "".join(f"<tr>{cells([c['backend'], c['model'], c['truncations']])}</tr>"
                         for c in truncations["counts"])
    event_columns = ["at", "request_id", "backend", "model", "counted_tokens", "reported_tokens"]
    event_rows = "".join(f"<tr>{cells([e[c] for c in event_columns])}</tr>" for e in truncations["recent"])
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>kvgate status</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}</style></head><body>"
        f"<h1>kvgate {html.escape(status['version'])}</h1><p>up {status['uptime_s']} s</p>"
        "<h2>Backends</h2><table>"
        f"<tr>{cells(['name', 'kind', 'url', 'models', 'routing', 'last error', 'notes'], 'th')}</tr>"
        f"{backend_rows}</table>"
        f"<h2>KV pools</h2><table><tr>{cells(pool_columns, 'th')}</tr>{pool_rows}</table>"
        f"<h2>GPUs</h2><table><tr>{cells(gpu_columns, 'th')}</tr>{gpu_rows}</table>"
        "<h2>Silent truncations</h2><p>replies whose reported prompt length is short of kvgate's count: the "
        "backend cut the prompt without saying so</p>"
        f"<table><tr>{cells(['backend', 'model', 'truncations'], 'th')}</tr>{count_rows}</table>"
        f"<h3>Latest</h3><table><tr>{cells(event_columns, 'th')}</tr>{event_rows}</table></body></html>"
    )


def _out_cell(routing: dict[str, Any] | None) -> str:
    """"out for 12.5 s (reason); 3 outages", "in; 1 outage", or "" without routing state."""
    if routing is None:
        return ""
    outages = f"{routing['outages']} outage{'' if routing['outages'] == 1 else 's'}"
    if routing.get("out_for_s") is None:
        return f"in; {outages}"
    return f"out for {routing['out_for_s']} s ({routing.get('out_reason') or ''}); {outages}"


def _pool_cell(pool: dict[str, Any], column: str) -> Any:
    """A pool's cell; its slots' source as "inferred: ...", the detail a person needs to check it."""
    if column == "slots_source":
        source = pool.get("slots_source")
        return "" if not source else f"{source['source']}: {source['detail']}"
    return "" if pool.get(column) is None else pool[column]


def _slots_source(source: SlotSource | None) -> dict[str, Any] | None:
    return None if source is None else {**source.to_json(), "detail": safe_text(source.detail)}


def _gpu_cell(gpu: dict[str, Any], column: str) -> Any:
    if column == "models":
        return ", ".join(f"{m['name']}: {m['resident_bytes']} ({m['source']})" for m in gpu.get("models", []))
    value = gpu.get(column)
    return "" if value is None else value


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
