"""The aiohttp application: routes, typed app state and the lifecycles of the client session and background tasks."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from gateway.admission import Ledger, WaitingRoom
from gateway.admission.admit import Admitter
from gateway.admission.keyless import keyless_caps_line
from gateway.admission.kv_pools import PoolDirectory, unadmitted_reason
from gateway.admission.shared.shared_pools import SharedPools, shared_pools
from gateway.admission.shared.shared_rates import TenantRates
from gateway.admission.step import AdmissionStep
from gateway.admission.tenant_keys import TenantDirectory
from gateway.api import kvgate as kvgate_api
from gateway.api import status as status_api
from gateway.backends import BackendRegistry
from gateway.backends.client import SKIPPED_AUTO_HEADERS
from gateway.backends.probes import BackendProbes
from gateway.config.reload import LiveSettings, Reloader, SettingsSource
from gateway.config.settings import ServerSettings, Settings
from gateway.domain import Operation
from gateway.edge import targets
from gateway.edge.admin_access import ProxiedHandler, admin_only, require_admin, warn_if_exposed
from gateway.edge.error_boundary import error_boundary
from gateway.edge.expect import expect_continue
from gateway.edge.limits import ClientLimits
from gateway.edge.refusals import refuse_over_peer_limit
from gateway.edge.routes import FALLBACK, ROUTES, Route
from gateway.edge.serving import CONNECTIONS, ConnectionCollector, Connections, GuardedRunner
from gateway.fitting.summaries import Summaries
from gateway.fitting.summary_writer import InternalCalls, Summarizer
from gateway.loads.gate import LoadGate
from gateway.loads.gpu_ledger import GpuBoard, LoadReservations
from gateway.loads.shared_gpu import SharedGpu
from gateway.memory.vram import VramSource
from gateway.observability import status_page
from gateway.observability.gpus import gpu_rows, refresh_gpus
from gateway.observability.ledger_health import SharedLedgerCollector, shared_status
from gateway.observability.metrics import CONTENT_TYPE, Metrics
from gateway.proxy import Proxy
from gateway.runtimes import runtime_for
from gateway.support.single_flight import SingleFlight
from gateway.support.tasks import stop
from gateway.tokens.prompt_counter import PromptCounter

SETTINGS = web.AppKey("settings", Settings)
"""The settings the app was built with; what new requests run under, after any reload, is ``LIVE``."""
LIVE = web.AppKey("live", LiveSettings)
RELOADER = web.AppKey("reloader", Reloader)
SESSION = web.AppKey("session", aiohttp.ClientSession)
REGISTRY = web.AppKey("registry", BackendRegistry)
PROXY = web.AppKey("proxy", Proxy)
PROBES = web.AppKey("probes", BackendProbes)
PROMPT_COUNTER = web.AppKey("prompt_counter", PromptCounter)
ADMITTER = web.AppKey("admitter", Admitter)
POOLS = web.AppKey("pools", PoolDirectory)
log = logging.getLogger(__name__)
METRICS = web.AppKey("metrics", Metrics)
STARTED = web.AppKey("started", float)
GPU_BOARD = web.AppKey("gpu_board", GpuBoard)
GPU_REFRESHES = web.AppKey("gpu_refreshes", SingleFlight[str, None])
STATUS_GPU_WAIT_S = 1.0
"""How long a /kvgate/status read waits for fresh GPU readings before it shows the last ones."""
LOAD_RESERVATIONS = web.AppKey("load_reservations", LoadReservations)
LOADS = web.AppKey("loads", LoadGate)
INTERNAL = web.AppKey("internal", InternalCalls)

SHARED = web.AppKey[SharedPools | None]("shared")
SessionFactory = Callable[[], aiohttp.ClientSession]


UPSTREAM_KEEPALIVE_S = 4.0
"""Idle upstream connections are closed after this: below llama-server's own 5 s keep-alive (cpp-httplib), so a
request is never sent on a connection the server is closing (it fails with "Server disconnected")."""


def default_session() -> aiohttp.ClientSession:
    """One pooled session for all upstream traffic: bytes pass through undecoded, no cookies are kept, and none of
    aiohttp's own headers is added (no User-Agent, Accept or Accept-Encoding a client did not send)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=UPSTREAM_KEEPALIVE_S),
        auto_decompress=False,
        skip_auto_headers=SKIPPED_AUTO_HEADERS,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        timeout=aiohttp.ClientTimeout(total=None),
    )


def create_app(
    settings: Settings,
    *,
    session_factory: SessionFactory = default_session,
    clock: Callable[[], float] = time.monotonic,
    refresh_models: bool = True,
    vram_sources: dict[str, VramSource] | None = None,
    settings_source: SettingsSource | None = None,
) -> web.Application:
    """Build the gateway. Every seam a test needs is a parameter. ``settings_source`` re-reads the configuration
    for a reload (``POST /kvgate/reload``; ``kvgate serve`` also on SIGHUP); without one, a reload is refused."""
    app = web.Application(client_max_size=int(settings.server.max_body_bytes) + 1)
    app.middlewares.append(error_boundary)  # every GatewayError a handler raises, in its route's dialect
    app.middlewares.append(refuse_over_peer_limit)  # a connection past server.max_connections_per_peer: 429
    app.middlewares.append(targets.reject_odd_targets)  # absolute-form and other odd targets: 400, never forwarded
    app[SETTINGS] = settings
    metrics = Metrics()
    app[METRICS] = metrics
    live = LiveSettings(settings, directory=TenantDirectory)
    app[LIVE] = live
    app[RELOADER] = Reloader(live, settings_source, on_outcome=metrics.record_reload)
    live.subscribe(warn_if_exposed)  # a reload that drops the last key, on a public address, is as loud as a start
    app[STARTED] = clock()
    warn_if_exposed(settings)
    live.subscribe(lambda reloaded: log.info("%s", keyless_caps_line(reloaded)))  # start-up: cli.py, after listening
    for deprecated in settings.residency.deprecations():  # a key an older kvgate wrote, still read
        log.warning("%s", deprecated)
    app[CONNECTIONS] = Connections(ClientLimits.from_settings(settings.server))  # gateway.edge.serving
    metrics.registry.register(ConnectionCollector(app[CONNECTIONS]))
    app[GPU_REFRESHES] = SingleFlight()
    app[GPU_BOARD] = GpuBoard()  # the GPU ledger's last budgets: refreshed on status reads and in the loop below
    app[LOAD_RESERVATIONS] = LoadReservations()
    app[INTERNAL] = InternalCalls()  # kvgate's requests to itself (summaries); its address is set once it listens
    metrics.watch_gpus(app[GPU_BOARD])

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        session = session_factory()
        registry = BackendRegistry(settings, session, clock=clock, runtime_for=runtime_for)
        app[SESSION] = session
        app[REGISTRY] = registry
        app[PROMPT_COUNTER] = PromptCounter(settings, runtime_for)
        app[PROBES] = BackendProbes(session, vram_sources)
        shared = shared_pools(settings.shared_ledger)  # None: the ledger lives in this process only
        app[SHARED] = shared
        room = WaitingRoom(Ledger(), shared=shared)
        shared_gpu = None if shared is None else SharedGpu(  # load decisions one replica at a time (shared_gpu.py)
            shared.store.client, prefix=settings.shared_ledger.prefix, replica=shared.store.replica,
            ttl_s=settings.shared_ledger.lease_ttl_s)
        if shared is not None:
            metrics.registry.register(SharedLedgerCollector(shared, shared_gpu))
        loads = LoadGate(settings, app[PROBES], room, app[LOAD_RESERVATIONS], clock=clock, shared_gpu=shared_gpu)
        app[LOADS] = loads
        metrics.watch_loads(lambda: loads.counts)
        pools = PoolDirectory(settings, app[PROBES], loads=loads)
        for backend in registry.backends:
            reason = unadmitted_reason(backend) if settings.admission.enabled else "admission is off"
            if reason is not None:
                log.warning("%s", reason)
        checks = asyncio.gather(*(pools.check_configured(backend) for backend in registry.backends))
        summaries = Summaries(Summarizer(session, app[INTERNAL]), cache_entries=settings.fitting.summary_cache_entries)
        metrics.watch_summaries(summaries)
        admitter = app[ADMITTER] = Admitter(live.settings.admission, pools, room, loads, summaries)
        live.subscribe(lambda reloaded: admitter.reconfigure(reloaded.admission))  # the same room and ledger
        metrics.watch_pools(room, pools.known)
        app[POOLS] = pools
        step = AdmissionStep(admitter, pools, registry, app[PROMPT_COUNTER], TenantRates(shared), loads)
        app[PROXY] = Proxy(live, registry, step, metrics, internal=app[INTERNAL])
        sharing = asyncio.create_task(shared.run(room.waiting_keys, room.redispatch)) if shared else None
        following = asyncio.create_task(loads.follow_other_replicas()) if shared_gpu else None
        refresher = asyncio.create_task(registry.run_refresh_loop()) if refresh_models else None
        gpu_refresher = asyncio.create_task(_refresh_gpus_forever(app)) if refresh_models else None
        yield
        await stop(following)
        if sharing is not None and shared is not None:
            await stop(sharing)  # cancelled again until it ends: Python 3.11 may lose one (gateway/support/tasks.py)
            await shared.close()
        await stop(gpu_refresher)
        await stop(checks)
        await step.slots.close()
        await pools.aclose()  # shared calls no request's cancellation ends: ended before the session closes
        await loads.aclose()
        await app[PROBES].aclose()
        await registry.aclose()
        await app[GPU_REFRESHES].aclose()
        await stop(refresher)
        await session.close()

    app.cleanup_ctx.append(lifecycle)
    _add_routes(app, settings)
    return app


Handler = Callable[[web.Request], Awaitable[web.Response]]


def _add_routes(app: web.Application, settings: Settings) -> None:
    """kvgate's own routes (/kvgate/...), then every proxied route of the table (edge/routes.py), then the rest."""
    app.router.add_get("/kvgate/health", kvgate_api.health, allow_head=True,  # every route: gateway.edge.expect
                       expect_handler=expect_continue)
    fit = kvgate_api.fit_handler(lambda r: (r.app[REGISTRY], r.app[PROBES]))
    count = kvgate_api.count_handler(lambda r: (r.app[REGISTRY], r.app[PROMPT_COUNTER], r.app[PROXY].bodies),
                                     max_body_bytes=int(settings.server.max_body_bytes),
                                     max_json_elements=settings.server.max_json_elements)
    app.router.add_get("/kvgate/fit", _for_tenants(fit), expect_handler=expect_continue)
    app.router.add_post("/kvgate/count", _for_tenants(count), expect_handler=expect_continue)
    app.router.add_get("/kvgate/metrics", _metrics, expect_handler=expect_continue)
    app.router.add_get("/kvgate/status", _status, expect_handler=expect_continue)
    app.router.add_get("/kvgate/tenants", _tenants, expect_handler=expect_continue)
    app.router.add_post("/kvgate/reload", _reload, expect_handler=expect_continue)
    status_page.add_routes(app.router, expect_handler=expect_continue)  # GET /kvgate/: the page a person reads
    for route in ROUTES:
        proxied: ProxiedHandler = functools.partial(_proxied, route=route)
        if route.operation is Operation.MANAGE and settings.server.admin_only_management:
            proxied = admin_only(proxied, route, _admin_key)
        for method in route.methods:
            app.router.add_route(method, route.path, proxied, expect_handler=expect_continue)
    app.router.add_route("*", "/kvgate/{tail:.*}", kvgate_api.unknown_kvgate_route,  # never forwarded
                         expect_handler=expect_continue)
    app.router.add_route("*", FALLBACK.path, functools.partial(_proxied, route=FALLBACK),
                         expect_handler=expect_continue)


def _for_tenants(handler: Handler) -> Handler:
    """kvgate's own client routes take the same API keys as the proxied ones."""

    async def checked(request: web.Request) -> web.Response:
        request.app[LIVE].tenants.identify(request.headers)  # a key no tenant has: 401 (error_boundary)
        return await handler(request)

    return checked


def _admin_key(request: web.Request) -> SecretStr | None:
    """The admin key as configured now (a reload may change it)."""
    return request.app[LIVE].settings.server.admin_key


async def _metrics(request: web.Request) -> web.Response:
    require_admin(request, _admin_key(request))
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _status(request: web.Request) -> web.Response:
    require_admin(request, _admin_key(request))
    app = request.app
    pools = app[POOLS]
    notes: dict[str, list[str]] = {}
    for backend in app[REGISTRY].backends:
        reason = unadmitted_reason(backend) if app[LIVE].settings.admission.enabled else "admission is off"
        notes[backend.name] = [reason] if reason else []
    for (backend_name, _), message in [*pools.disagreements.items(), *pools.slots.disagreements.items()]:
        notes.setdefault(backend_name, []).append(message)
    for pool in pools.known().values():
        notes.setdefault(pool.backend, []).extend(pools.notes_for(pool))  # a context chosen by a fallback, and why
    # Fresh GPU readings, shared by concurrent status reads; a slow backend can't hold the page: after
    # STATUS_GPU_WAIT_S it shows the last readings while the refresh finishes.
    refresh = asyncio.ensure_future(app[GPU_REFRESHES].run("gpus", lambda: _refresh_gpus(app), join_running=True))
    shared = app[SHARED]
    if shared is not None:  # every known pool's totals across replicas, also those this replica never admitted to
        await shared.watch(pools.known().values(), timeout_s=STATUS_GPU_WAIT_S)
    await asyncio.wait({refresh}, timeout=STATUS_GPU_WAIT_S)
    status = status_api.status_snapshot(app[REGISTRY], app[ADMITTER].room, pools.known(),
                                        time.monotonic() - app[STARTED], app[METRICS].truncation_log.snapshot(), notes,
                                        gpus=gpu_rows(app[GPU_BOARD], app[LOADS].counts),
                                        routing=app[PROXY].router.status, slot_sources=pools.slots.sources,
                                        outcomes=app[METRICS].outcomes)
    live = app[LIVE]
    status["config"] = {"reloaded_at_s": live.reloaded_at_s, "needs_restart": list(live.needs_restart)}
    status["recent"] = app[METRICS].recent_decisions.snapshot()  # newest first (observability/decisions.py)
    status["shared_ledger"] = shared_status(app[SHARED], app[LOADS].shared_gpu)
    status["longest_prompts"] = app[METRICS].longest_prompts.snapshot()  # kvgate check --gateway reads these
    if "text/html" in request.headers.get("Accept", ""):
        return web.Response(text=status_api.status_html(status), content_type="text/html")
    return web.json_response(status)


async def _tenants(request: web.Request) -> web.Response:
    """Usage per tenant (admin, like ``/kvgate/status``); no I/O."""
    require_admin(request, _admin_key(request))
    app = request.app
    return web.json_response(status_api.tenants_snapshot(app[METRICS].tenant_usage, app[LIVE].settings.tenants,
                                                         app[ADMITTER].room))


async def _reload(request: web.Request) -> web.Response:
    """Re-read the configuration (admin; gateway/config/reload.py): 200 with the settings changed and those that need a
    restart, by name; 400 ``invalid_config`` naming the setting, with nothing changed."""
    require_admin(request, _admin_key(request))
    # shielded: a client that leaves mid-reload does not cut it in two; ReloadRefused is a 400 invalid_config
    report = await asyncio.shield(request.app[RELOADER].reload("POST /kvgate/reload"))
    return web.json_response({"reloaded": True, "changed": list(report.changed),
                              "needs_restart": list(report.needs_restart)})


async def _refresh_gpus(app: web.Application) -> None:
    """refresh_gpus reports an unreadable GPU on the board; anything else is a bug, logged, never a failed page."""
    try:
        await refresh_gpus(app[REGISTRY], app[PROBES], app[LOAD_RESERVATIONS], app[GPU_BOARD], app[LOADS].shared_gpu)
    except Exception:
        log.exception("GPU ledger refresh failed")


async def _refresh_gpus_forever(app: web.Application) -> None:
    """Keep the GPU gauges current between status reads, every ``models_refresh_s``."""
    while True:
        await _refresh_gpus(app)
        await asyncio.sleep(app[LIVE].settings.models_refresh_s)


async def _proxied(request: web.Request, *, route: Route) -> web.StreamResponse:
    return await request.app[PROXY].handle(request, route)


async def start_server(app: web.Application, host: str, port: int, *,
                       reuse_port: bool = False) -> tuple[web.AppRunner, int]:
    """Serve ``app``; a client that disconnects cancels its handler, which closes the upstream request. Client
    connections get the header and body deadlines and the cap of ``gateway.edge.serving`` (an app not built by
    ``create_app``, like a test's fake backend, gets the default settings). ``reuse_port``: one of the workers of
    ``kvgate serve --workers N``, which all listen on the port (gateway/cli/workers.py)."""
    connections = app.get(CONNECTIONS) or Connections(ClientLimits.from_settings(ServerSettings()))
    # auto_decompress=False: request bodies arrive as sent; kvgate decodes those it reads (gateway.edge.body.encoding,
    # bounded) and passes the others through with their Content-Encoding
    runner = GuardedRunner(app, connections, handler_cancellation=True, access_log=None, auto_decompress=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound_port = int(sockets[0].getsockname()[1]) if sockets else port
    internal = app.get(INTERNAL)
    if internal is not None:
        internal.url = f"http://{_reachable(host)}:{bound_port}"
    return runner, bound_port


def _reachable(host: str) -> str:
    """The address kvgate reaches itself at when it listens on ``host`` (loopback for the wildcard)."""
    if host in ("", "0.0.0.0"):  # noqa: S104 (not a bind: the wildcard kvgate listens on)
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
