"""The one orchestrator of the request path (design.md section 3); each step lives in the module named beside it.

    exchange             admission/exchange.py   one per request: its facts, frozen, and what the path learns
    tenant               admission/tenant_keys.py  API key to tenant and its caps
    read the body        edge/body/reader.py     decoded, bounded, held under the request's lease (edge/body/budget.py)
                         edge/body/json_bound.py its JSON elements bounded before parsing; parsed off-loop if large
    parse                dialects/               once, into a frozen ParsedRequest (domain.py)
    route                backends/registry.py    the backends serving the model, and their own names for it;
                         routing/                which of them: ranked by memory, sticky by conversation, a
                                                 backend that fails before answering is retried elsewhere
    admit                admission/step.py       one call, AdmissionStep.step(exchange) -> Admitted | Refused: the
                                                 model, its KV pool (kv_pools.py), the count (tokens/), the rate;
                                                 plan (planner.py, pure), fit (fitting/), reserve or wait
                                                 (admit.py, waiting_room.py); load requests: AdmissionStep.load
    forward              backends/client.py      the backend's one client: auth, Host, timeouts, transport errors
    stream back          streaming.py            relay(request, upstream, RelayPlan) -> Relayed: bytes pass
                                                 through, usage observed; a cut comes back, the backend is out
    release              Admitted.release        the permit, the claim and the reload marks, once
    observe              observability/          truncation checked (reply_checks.py); the log line, metrics and
                                                 recent decisions rendered from the exchange (exchange_log.py)
    listings             edge/listing.py         /api/tags, /api/ps, /v1/models: every backend's list, merged

Errors are raised as ``gateway.errors`` and rendered once, in the dialect of the route (edge/error_boundary.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web

from gateway import dialects
from gateway.admission.elastic import Growth
from gateway.admission.exchange import Exchange, RequestBody, RequestFacts
from gateway.admission.outcome import response_headers
from gateway.admission.shared.fencing import FenceSignal, fenced
from gateway.admission.slot_watch import ended_as_refusal
from gateway.admission.step import AdmissionStep, Admitted, Refused
from gateway.admission.tenant_keys import ADMIN_TENANT, Tenant, TenantDirectory
from gateway.backends import Backend, BackendRegistry
from gateway.config.reload import LiveSettings
from gateway.dialects.stream_end import StreamEnding
from gateway.domain import Operation
from gateway.edge.body.budget import BodyBudget, BodyLease
from gateway.edge.body.json_bound import decode_bounded
from gateway.edge.body.reader import read_body
from gateway.edge.error_boundary import error_response
from gateway.edge.headers import Hop, request_deadline, request_id_for, upstream_request_headers
from gateway.edge.listing import merged_listing
from gateway.edge.routes import FALLBACK, Handling, Route, fallback_dialect
from gateway.errors import BackendTimeout, BackendUnavailable, BadRequest, GatewayError, InternalError, ModelNotFound
from gateway.fitting.summary_writer import ROUTE_BACKEND_HEADER, SUMMARIZER_TENANT, InternalCalls
from gateway.loads.keep_alive import carries_admin_key, unloads
from gateway.loads.load_requests import is_load_request, keep_alive_of
from gateway.loads.oom import GpuOutOfMemory, oom_refusal
from gateway.loads.oom_catch import held_unless_oom
from gateway.notice import Notice, reply_notice
from gateway.observability.exchange_log import finish
from gateway.observability.logs import request_id_var
from gateway.observability.metrics import Metrics
from gateway.observability.reply_checks import ReplyChecks, TruncationCheck, usage_counts_prompt
from gateway.observability.request_log import logged_content
from gateway.observability.tenant_usage import refusal_reason
from gateway.observability.usage import UsageObserver
from gateway.routing import ROUTE_HEADER, BackendFailed, RouteCollector, RoutePlan, Router
from gateway.streaming import RelayPlan, relay

log = logging.getLogger("gateway.proxy")


@dataclass(frozen=True, slots=True)
class Forwarding:
    """What kvgate does to one forward beyond sending it: read the reply's usage (``observer``), name a silent
    truncation of the forwarded prompt (``truncation``), add a notice, wait for a restarting backend, tell an
    out-of-memory apart, end it when the shared ledger fences it."""

    observer: UsageObserver | None = None
    truncation: TruncationCheck | None = None
    notice: Notice | None = None
    wait_restart: bool = True
    catch_oom: bool = False
    fence: FenceSignal | None = None
    growth: Growth | None = None
    """An elastic reservation, fed the reply's events as it streams (it may end the reply: admission/elastic.py)."""


PLAIN = Forwarding()


class Proxy:
    def __init__(
        self,
        live: LiveSettings[TenantDirectory],
        registry: BackendRegistry,
        step: AdmissionStep,
        metrics: Metrics,
        internal: InternalCalls | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._live = live  # the settings and tenants of new requests; a reload replaces them (gateway/config/reload.py)
        self._internal = internal
        self._registry = registry
        self._step = step
        self._metrics = metrics
        self._clock = clock
        self._router = Router(step)
        self._checks = ReplyChecks(live, step.counter, metrics)  # after a counted reply: truncation, calibration
        metrics.registry.register(RouteCollector(self._router, lambda: [b.name for b in registry.backends]))
        server = live.settings.server  # the body budget is bound at start (server.* needs a restart)
        self.bodies = BodyBudget(int(server.max_held_body_bytes), wait_s=server.held_body_wait_s)
        """Request-body bytes held at once, across the proxied routes and /kvgate/count."""
        live.subscribe(step.reloaded)

    @property
    def router(self) -> Router:
        """Which backend each request goes to (its outage book and routing state: the status page)."""
        return self._router

    async def handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        facts = RequestFacts(
            request_id=request_id_for(request.headers), method=request.method, path=request.path,
            route_label=route.path if route is not FALLBACK else "other",
            dialect=fallback_dialect(request.path) if route is FALLBACK else route.dialect,
            settings=self._live.settings,  # read once: the request runs under one configuration, whatever reloads
            started_s=self._clock())
        exchange = Exchange(facts, request)
        token = request_id_var.set(facts.request_id)
        lease = self.bodies.lease()  # the body bytes this request holds, given back when it is over
        try:
            exchange.identified(self._identify(request))
            response = await self._dispatch(exchange, route, lease)
            exchange.status = response.status
            return response
        except GatewayError as exc:
            exchange.status, exchange.error = exc.status, exc.message
            if exchange.refusal is None:
                exchange.refusal = refusal_reason(exc, in_admission=False)
            return self._error_response(exchange, exc)
        except asyncio.CancelledError:
            exchange.status = 499
            log.info("client disconnected; upstream request closed")
            raise
        except Exception:
            exchange.status = 500
            log.exception("internal error")
            return self._error_response(exchange, InternalError(
                f"internal error in kvgate (request {facts.request_id})"))
        finally:
            lease.release()
            await self._step.settle(exchange)
            finish(self._metrics, exchange, self._clock() - facts.started_s)
            request_id_var.reset(token)

    def _identify(self, request: web.Request) -> Tenant:
        """kvgate's own summary requests, the admin, or the tenant the key names (a bad key raises 401)."""
        if self._internal is not None and self._internal.is_internal(request.headers):
            return Tenant(SUMMARIZER_TENANT)
        if carries_admin_key(request.headers, self._live.settings.server.admin_key):
            return Tenant(ADMIN_TENANT)
        return self._live.tenants.identify(request.headers)

    @staticmethod
    def _error_response(exchange: Exchange, error: GatewayError) -> web.Response:
        if error.status >= 500:
            log.warning("%s", error.message)
        return error_response(error, exchange.facts.dialect, request_id=exchange.facts.request_id)

    async def _dispatch(self, exchange: Exchange, route: Route, lease: BodyLease) -> web.StreamResponse:
        request = exchange.http
        if route.handling is Handling.LISTING:
            return await merged_listing(self._registry, request, route, exchange.facts.request_id)
        if route.handling is Handling.PASSTHROUGH:
            exchange.asked_model = request.match_info.get("model")
            backend = exchange.backend = await self._registry.resolve(exchange.asked_model, route.kind)
            streamed = request.content.iter_any() if request.body_exists else None
            try:
                return await self._forward(exchange, streamed, {})
            finally:
                if route.operation is Operation.MANAGE:
                    backend.listed_at_s = None  # a pull, create, copy or delete: list its models anew when asked
        await self._read(exchange, route, lease)
        body = exchange.body
        assert body is not None
        backends = await self._backend_for(exchange, route)
        backend = exchange.backend = backends[0]
        if is_load_request(body.parsed, backend):  # through the load gate, like a load a request causes
            return await self._load_request(exchange, backend)
        if not body.parsed.allocates_kv:
            return await self._forward(exchange, body.raw, dict(body.headers))
        return await self._route(exchange, backends)

    async def _read(self, exchange: Exchange, route: Route, lease: BodyLease) -> None:
        """Read the body (bounded, held under the request's lease), parse it once, and take a client keep_alive
        off it: the exchange's body."""
        request, settings = exchange.http, exchange.facts.settings
        raw = await read_body(request, lease, max_bytes=int(settings.server.max_body_bytes))
        decoded = await decode_bounded(raw, max_elements=settings.server.max_json_elements)  # off-loop when large
        parsed = dialects.parse(exchange.facts.dialect, route.operation, decoded, request.path)
        exchange.asked_model = parsed.model
        raw, parsed, notes = keep_alive_of(request.headers, request.path, raw, parsed, settings)
        exchange.body = RequestBody(parsed, raw, notes)
        if settings.server.log_contents:
            exchange.content = logged_content(parsed)

    async def _load_request(self, exchange: Exchange, backend: Backend) -> web.StreamResponse:
        """An Ollama load or unload request, through the load gate (loads/load_requests.py)."""
        body = exchange.body
        assert body is not None
        try:
            model = await self._registry.target_model(backend, body.parsed.model)
        except ModelNotFound:  # nothing to load: the backend answers as it would
            return await self._forward(exchange, body.raw, dict(body.headers))
        if unloads(body.parsed.body):
            async with self._step.unloading(exchange):
                return await self._forward(exchange, body.raw, dict(body.headers))
        result = await self._step.load(exchange, model)
        if isinstance(result, Refused):
            raise result.error
        try:
            return await self._forward(exchange, result.body, dict(body.headers))
        finally:
            result.release()

    async def _route(self, exchange: Exchange, backends: list[Backend]) -> web.StreamResponse:
        """Serve the request on the backend routing ranks first; on the next only when the last failed before
        anything reached the client."""
        body, settings = exchange.body, exchange.facts.settings
        assert body is not None
        plan = await self._router.plan(body.parsed, backends, settings.routing,
                                       settings.admission.default_output_tokens)
        exchange.deadline = request_deadline(exchange.http.headers)
        for backend, why in plan:
            exchange.backend = backend
            headers = {**body.headers, **({ROUTE_HEADER: why} if plan.routed else {})}
            try:
                try:
                    response = await self._serve(exchange, plan, headers)
                except GpuOutOfMemory as oom:  # nothing reached the client: a fresh reading, one retry, else 503
                    await self._step.after_oom(backend, oom.model, oom.words)
                    response = await self._serve(exchange, plan, headers, retried=True)
            except BackendFailed as failure:
                if not plan.failed(failure):
                    raise failure.error from None
                log.warning("%s; retrying on the next backend", failure.error.message)
                continue
            finally:
                plan.settle()
            plan.served(backend, response.status)
            return response
        raise AssertionError("a route plan has at least one backend")

    async def _serve(
        self, exchange: Exchange, plan: RoutePlan, route_headers: dict[str, str], *, retried: bool = False,
    ) -> web.StreamResponse:
        """Admit the request on the exchange's backend and forward it; raises BackendFailed when the backend failed
        before anything was sent to the client (its permit released: another backend may take the request), and
        GpuOutOfMemory when it ran out of GPU memory (``retried``: then it is a 503, loads/oom.py)."""
        backend = exchange.backend
        assert backend is not None
        result = await self._step.step(exchange)
        if isinstance(result, Refused):
            if result.backend_failed:
                raise BackendFailed(backend, result.error)
            exchange.refusal = refusal_reason(result.error, in_admission=True)
            exchange.summary_failure = result.summary_failure
            raise result.error
        if result.outcome is None:  # it reserves nothing on this backend (an embedding on Ollama)
            return await self._serve_unreserved(exchange, result, route_headers)
        plan.admitted()  # the ledger holds it now; its service time starts
        return await self._serve_admitted(exchange, result, {**response_headers(result.outcome), **route_headers},
                                          wait_restart=not plan.routed, retried=retried)

    async def _serve_unreserved(
        self, exchange: Exchange, admitted: Admitted, route_headers: dict[str, str],
    ) -> web.StreamResponse:
        backend = exchange.backend
        assert backend is not None
        try:
            return await self._forward(exchange, admitted.body, route_headers)
        except (BackendUnavailable, BackendTimeout) as exc:  # nothing was sent: another backend may take it
            raise BackendFailed(backend, exc) from None
        finally:
            admitted.release()

    async def _serve_admitted(
        self, exchange: Exchange, admitted: Admitted, headers: dict[str, str], *, wait_restart: bool, retried: bool,
    ) -> web.StreamResponse:
        """Forward an admitted request; what it holds is given back once its response ended, however it ended."""
        backend, parsed, outcome = exchange.backend, exchange.parsed, admitted.outcome
        assert backend is not None and outcome is not None
        checked = usage_counts_prompt(parsed, exchange.count)  # the reply's usage is checked for a truncation
        counted = checked or (exchange.rate_charge is not None and exchange.rate_charge.counts_tokens)
        # a unified pool's answers are measured for elastic reservations (admission/output_lengths.py)
        learns = admitted.pool is not None and admitted.pool.unified
        observer = UsageObserver() if counted or learns or admitted.growth is not None else None
        if observer is not None:
            exchange.usage = observer  # read once the request is over: the rate's settlement
        notice = None if admitted.pool is None or admitted.fit is None else reply_notice(
            parsed, outcome, admitted.pool.slot_ctx_tokens, enabled=admitted.fit.notice)
        truncation = None if not checked else TruncationCheck(
            outcome.forwarded_count, exchange.facts.settings.counting.estimate_safety_margin)
        out_of_memory = False
        try:
            with fenced(self._step.fences(), admitted.lease) as fence, ended_as_refusal(admitted.growth):
                response = await self._forward(exchange, admitted.body, headers, Forwarding(
                    observer, truncation, notice, wait_restart=wait_restart,  # else: the next backend
                    catch_oom=admitted.catches_oom, fence=fence, growth=admitted.growth))
        except (BackendUnavailable, BackendTimeout) as exc:  # nothing was sent: the client waits on
            raise BackendFailed(backend, exc) from None
        except GpuOutOfMemory as oom:
            out_of_memory = True  # the runner may be gone: its layout is read anew
            model = exchange.model or ""
            if retried:
                raise oom_refusal(backend.describe(), model, oom.words, retried=True) from None
            oom.model = model
            raise
        finally:
            admitted.release(out_of_memory=out_of_memory)
            if admitted.growth is not None:
                exchange.streamed_tokens = admitted.growth.output_tokens
                exchange.elastic_end = admitted.growth.ended
        if observer is not None and response.status == 200:
            exchange.output_tokens = observer.output_tokens()
            if exchange.streamed_tokens is None and observer.streamed_chunks:
                exchange.streamed_tokens = observer.streamed_chunks  # a stream without usage: its events
        if checked and observer is not None and response.status == 200:
            await self._checks.observe(parsed, backend, outcome, observer.prompt_tokens(), exchange.model or "")
        return response

    async def _backend_for(self, exchange: Exchange, route: Route) -> list[Backend]:
        """The backends that serve the model (routing picks one); kvgate's own summary requests may name one
        (``X-Kvgate-Route-Backend``, ignored on a client's request)."""
        headers = exchange.http.headers
        named = headers.get(ROUTE_BACKEND_HEADER)
        if named and exchange.tenant.name == SUMMARIZER_TENANT and self._internal is not None \
                and self._internal.is_internal(headers):
            found = next((b for b in self._registry.backends if b.name == named), None)
            if found is None:
                raise BadRequest(f"fitting.summary_backend names backend {named!r}; kvgate has "
                                 f"{', '.join(b.name for b in self._registry.backends)}")
            return [found]
        return await self._registry.serving(exchange.parsed.model, route.kind)

    async def _forward(
        self, exchange: Exchange, body: bytes | AsyncIterator[bytes] | None, headers_out: dict[str, str],
        how: Forwarding = PLAIN,
    ) -> web.StreamResponse:
        """Send the request to the exchange's backend and relay its answer, as ``how`` says; a notice is asked of
        the backend uncompressed."""
        request, backend, request_id = exchange.http, exchange.backend, exchange.facts.request_id
        assert backend is not None
        headers = upstream_request_headers(
            request.headers, Hop(backend.host_header, request_id, backend.api_key),
            client_ip=request.remote,  # kvgate's keys (a tenant's, the admin's) stay in kvgate
            strip_client_keys=self._live.tenants.enabled or carries_admin_key(request.headers,
                                                                              self._live.settings.server.admin_key),
            body_decoded=isinstance(body, bytes),  # a body kvgate read is forwarded decoded (edge/body/encoding.py)
        )
        if how.notice is not None:
            headers["Accept-Encoding"] = "identity"  # the reply is rewritten: kvgate must read it
        upstream = await backend.client.open(request.method, request.raw_path, headers, body,
                                             wait_restart=how.wait_restart)
        try:
            extra = {"X-Kvgate-Backend": backend.name, **headers_out}
            held = await held_unless_oom(upstream, request_id=request_id, extra_headers=extra) \
                if how.catch_oom else None
            if held is not None:  # a 500 that was no out-of-memory, read whole to tell
                return held
            relayed = await relay(request, upstream, RelayPlan(
                exchange.facts.dialect, request_id, backend.describe(), backend.settings.timeouts.idle_s, extra,
                coalesce_s=self._live.settings.server.stream_coalesce_s, observer=how.observer,
                truncation=how.truncation if how.observer is not None else None, notice=how.notice, fence=how.fence,
                growth=how.growth, ending=None if how.growth is None else StreamEnding(
                    exchange.facts.dialect, exchange.parsed.operation, exchange.parsed.model or "", request_id)))
        finally:
            upstream.close()
        if relayed.cut is not None:  # the answer broke off mid-way: take the backend out (routing.down_s)
            self._router.failed(backend.name, f"its answer broke off mid-way: {relayed.cut}",
                                self._live.settings.routing)
        return relayed.response
