"""The one orchestrator of the request path (design.md section 3); each step lives in the module named beside it.

    read the body        edge/body/reader.py     decoded, bounded, held under the request's lease (edge/body/budget.py)
                         edge/body/json_bound.py its JSON elements bounded before parsing; parsed off-loop if large
    parse                dialects/               once, into a frozen ParsedRequest (domain.py)
    tenant               admission/tenant_keys.py  API key to tenant and its caps
    route                backends/registry.py    the backends serving the model, and their own names for it;
                         routing/                which of them: ranked by memory, sticky by conversation, a
                                                 backend that fails before answering is retried elsewhere
    find the pool        admission/kv_pools.py   the model's KV pool, probed through backends/probes.py
    count                tokens/prompt_counter.py  the prompt's tokens, exact where a counter can
    admit                admission/admit.py      plan (planner.py, pure), fit (fitting/), reserve or wait
                                                 (waiting_room.py, ledger.py): one AdmissionOutcome (outcome.py)
    forward              backends/client.py      the backend's one client: auth, Host, timeouts, transport errors
    stream back          streaming.py            bytes pass through; usage observed (observability/usage.py)
    release + observe    here, observability/reply_checks.py the permit is released; truncation checked
                                                 (observability/truncation.py); calibration; metrics and the
                                                 log line rendered from the outcome (observability/metrics.py)
    listings             backends/listing.py     /api/tags, /api/ps, /v1/models: every backend's list, merged

Errors are raised as ``gateway.errors`` and rendered once, in the dialect of the route, by edge/error_boundary.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web

from gateway import dialects
from gateway.admission import AdmissionRejected
from gateway.admission.admit import Admitter
from gateway.admission.charging import reserved_output, settle_rate, take_rate
from gateway.admission.outcome import AdmissionOutcome, response_headers
from gateway.admission.rate_charge import RateCharge
from gateway.admission.rates import RateLimit
from gateway.admission.sequence_rules import reserves_kv
from gateway.admission.shared.fencing import Fences, FenceSignal, fenced
from gateway.admission.shared.shared_rates import TenantRates
from gateway.admission.tenant_keys import ADMIN_TENANT, Tenant
from gateway.admission.types import PoolKey
from gateway.backends import Backend, BackendRegistry
from gateway.backends.listing import merged_listing
from gateway.config.reload import LiveSettings
from gateway.config.settings import Settings
from gateway.domain import BackendKind, Dialect, Operation, ParsedRequest
from gateway.edge.body.budget import BodyBudget, BodyLease
from gateway.edge.body.json_bound import decode_bounded
from gateway.edge.body.reader import read_body
from gateway.edge.error_boundary import error_response
from gateway.edge.headers import request_deadline, request_id_for, upstream_request_headers
from gateway.edge.routes import FALLBACK, Handling, Route, fallback_dialect
from gateway.errors import (
    BackendNotReady,
    BackendTimeout,
    BackendUnavailable,
    BadRequest,
    GatewayError,
    InternalError,
    ModelNotFound,
)
from gateway.fitting.policy import FitPolicy, policy_for
from gateway.fitting.summary_writer import ROUTE_BACKEND_HEADER, SUMMARIZER_TENANT, InternalCalls
from gateway.loads.keep_alive import carries_admin_key
from gateway.loads.load_requests import is_load_request, keep_alive_of, serve_load_request
from gateway.loads.oom import GpuOutOfMemory, oom_refusal, room_after_oom
from gateway.loads.oom_catch import held_unless_oom
from gateway.notice import Notice, reply_notice
from gateway.observability.logs import ClientText, request_id_var
from gateway.observability.metrics import Metrics, record
from gateway.observability.reply_checks import ReplyChecks, usage_counts_prompt
from gateway.observability.request_log import logged_content, request_fields
from gateway.observability.tenant_usage import UNIDENTIFIED, refusal_reason
from gateway.observability.usage import UsageObserver
from gateway.routing import ROUTE_HEADER, BackendFailed, RouteCollector, RoutePlan, Router
from gateway.streaming import relay
from gateway.tokens import TokenCount
from gateway.tokens.prompt_counter import PromptCounter

log = logging.getLogger("gateway.proxy")

def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


@dataclass(slots=True)
class _Trace:
    """What the request path learned so far, for the request's log line and metrics: the backend it chose ("-"
    until one is) and what admission did (None until it admitted)."""

    backend: str = "-"
    outcome: AdmissionOutcome | None = None
    admitting: bool = False
    """True while the admission step runs (a refusal raised then is admission's)."""
    output_tokens: int | None = None
    """The output length the backend reported (observability/usage.py), for the tenant's usage."""
    refusal: str | None = None
    model: str = "-"
    asked_model: str | None = None
    """The model the client named, for the log line until the pool's own name is known (``model``)."""
    count: TokenCount | None = None
    """The prompt's count, for the log line of a request refused before admission ended."""
    content: str | None = None
    """The last user message, only with ``server.log_contents`` (request_log.logged_content)."""
    pool: PoolKey | None = None
    """The pool the request was planned in, for its counts (observability/outcomes.py)."""
    summary_failure: str | None = None
    """Why a summary tried before a refusal failed (``SummaryFailed.reason``)."""
    rate_charge: RateCharge | None = None
    """What the tenant's rate was charged up front, settled once the request ends (rate_charge.py)."""
    usage: UsageObserver | None = None
    """What the reply reported or streamed, for the settlement."""


class Proxy:
    def __init__(
        self,
        live: LiveSettings,
        registry: BackendRegistry,
        counter: PromptCounter,
        admitter: Admitter,
        metrics: Metrics,
        clock: Callable[[], float] = time.perf_counter,
        internal: InternalCalls | None = None,
        rates: TenantRates | None = None,
    ) -> None:
        self._live = live  # the settings and tenants of new requests; a reload replaces them (gateway/config/reload.py)
        self._internal = internal
        self._rates = rates or TenantRates()  # shared across replicas with a shared ledger
        self._registry = registry
        self._counter = counter
        self._admitter = admitter
        self._metrics = metrics
        self._clock = clock
        self._router = Router(admitter)
        self._checks = ReplyChecks(live, counter, metrics)  # after a counted reply: truncation, calibration
        metrics.registry.register(RouteCollector(self._router, lambda: [b.name for b in registry.backends]))
        server = live.settings.server  # the body budget is bound at start (server.* needs a restart)
        self.bodies = BodyBudget(int(server.max_held_body_bytes), wait_s=server.held_body_wait_s)
        """Request-body bytes held at once, across the proxied routes and /kvgate/count."""
        live.subscribe(self._reloaded)

    @property
    def router(self) -> Router:
        """Which backend each request goes to (its outage book and routing state: the status page)."""
        return self._router

    def _reloaded(self, settings: Settings) -> None:
        """Keep the rate buckets of the tenants (and rates) that remain."""
        self._rates.retain({name: RateLimit(tenant.tokens_per_minute, tenant.requests_per_minute)
                            for name, tenant in settings.tenants.items()})

    async def handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        request_id = request_id_for(request.headers)
        token = request_id_var.set(request_id)
        dialect = fallback_dialect(request.path) if route is FALLBACK else route.dialect
        started_s = self._clock()
        status = 0
        detail: dict[str, object] = {"tenant": UNIDENTIFIED}  # until the key names one
        trace = _Trace()
        lease = self.bodies.lease()  # the body bytes this request holds, given back when it is over
        try:
            internal = self._internal is not None and self._internal.is_internal(request.headers)
            admin = carries_admin_key(request.headers, self._live.settings.server.admin_key)
            tenant = Tenant(SUMMARIZER_TENANT) if internal else Tenant(ADMIN_TENANT) if admin \
                else self._live.tenants.identify(request.headers)
            detail["tenant"] = tenant.name
            response = await self._dispatch(request, route, dialect, request_id, tenant, lease, trace)
            status = response.status
            return response
        except GatewayError as exc:
            status = exc.status
            detail["error"] = exc.message
            if isinstance(exc, AdmissionRejected):
                trace.summary_failure = exc.summary_failure
            trace.refusal = refusal_reason(exc, in_admission=trace.admitting)
            return self._error_response(dialect, exc, request_id)
        except asyncio.CancelledError:
            status = 499
            log.info("client disconnected; upstream request closed")
            raise
        except Exception:
            status = 500
            log.exception("internal error")
            return self._error_response(dialect, InternalError(f"internal error in kvgate (request {request_id})"),
                                        request_id)
        finally:
            lease.release()
            await settle_rate(self._rates, trace.rate_charge, trace.usage, status)
            elapsed_s = self._clock() - started_s
            detail.update(request_fields(
                status=status, backend=trace.backend, model=trace.asked_model if trace.model == "-" else trace.model,
                outcome=trace.outcome, count=trace.count, refusal=trace.refusal, content=trace.content))
            log.info("%s %s %d", request.method, ClientText(request.path), status,
                     extra={"duration_ms": round(elapsed_s * 1000, 2), **detail})
            route_label = route.path if route is not FALLBACK else "other"
            record(self._metrics, route_label, status, elapsed_s, backend=trace.backend,
                   tenant=str(detail.get("tenant", UNIDENTIFIED)), outcome=trace.outcome,
                   output_tokens=trace.output_tokens, refusal=trace.refusal, pool=trace.pool,
                   summary_failure=trace.summary_failure)
            self._metrics.recent_decisions.add(request_id=request_id, tenant=str(detail.get("tenant", UNIDENTIFIED)),
                                               backend=trace.backend, model=trace.model, status=status,
                                               outcome=trace.outcome, refusal=trace.refusal,
                                               error=str(detail.get("error", "")) or None)
            if trace.count is not None:
                self._metrics.longest_prompts.see(trace.backend, trace.model, trace.count.tokens, trace.count.exact)
            request_id_var.reset(token)

    def _error_response(self, dialect: Dialect, error: GatewayError, request_id: str) -> web.Response:
        if error.status >= 500:
            log.warning("%s", error.message)
        return error_response(error, dialect, request_id=request_id)

    async def _dispatch(
        self, request: web.Request, route: Route, dialect: Dialect, request_id: str, tenant: Tenant,
        lease: BodyLease, trace: _Trace,
    ) -> web.StreamResponse:
        if route.handling is Handling.LISTING:
            return await merged_listing(self._registry, request, route, request_id)
        if route.handling is Handling.PASSTHROUGH:
            model = trace.asked_model = request.match_info.get("model")
            backend = await self._registry.resolve(model, route.kind)
            trace.backend = backend.name
            body = request.content.iter_any() if request.body_exists else None
            try:
                return await self._forward(request, backend, body, dialect, request_id, {})
            finally:
                if route.operation is Operation.MANAGE:
                    backend.listed_at_s = None  # a pull, create, copy or delete: list its models anew when asked
        settings = self._live.settings  # read once: this request runs under one configuration, whatever reloads
        raw = await read_body(request, lease, max_bytes=int(settings.server.max_body_bytes))
        decoded = await decode_bounded(raw, max_elements=settings.server.max_json_elements)  # off-loop when large
        parsed = dialects.parse(dialect, route.operation, decoded, request.path)
        trace.asked_model = parsed.model
        raw, parsed, notes = keep_alive_of(request.headers, request.path, raw, parsed, settings)
        if settings.server.log_contents:
            trace.content = logged_content(parsed)
        backends = await self._backend_for(request, parsed, route, tenant)
        backend = backends[0]
        trace.backend = backend.name
        if is_load_request(parsed, backend):  # through the load gate, like a load a request causes
            try:
                model = await self._registry.target_model(backend, parsed.model)
            except ModelNotFound:  # nothing to load: the backend answers as it would
                return await self._forward(request, backend, raw, dialect, request_id, notes)
            return await serve_load_request(
                self._admitter, backend, model, parsed, raw,
                lambda body: self._forward(request, backend, body, dialect, request_id, notes),
                pin_num_ctx=settings.admission.pin_num_ctx)
        if not parsed.allocates_kv:
            return await self._forward(request, backend, raw, dialect, request_id, notes)
        plan = await self._router.plan(parsed, backends, settings.routing, settings.admission.default_output_tokens)
        for backend, why in plan:  # the next one only after the last failed before anything reached the client
            trace.backend = backend.name
            headers = {**notes, **({ROUTE_HEADER: why} if plan.routed else {})}
            try:
                try:
                    response = await self._serve(request, parsed, raw, dialect, request_id, tenant, settings, trace,
                                                 backend, plan, headers)
                except GpuOutOfMemory as oom:  # nothing reached the client: a fresh reading, one retry, else 503
                    await room_after_oom(self._admitter.loads, backend, oom.model, oom.words, retried=False)
                    response = await self._serve(request, parsed, raw, dialect, request_id, tenant, settings, trace,
                                                 backend, plan, headers, retried=True)
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
        self, request: web.Request, parsed: ParsedRequest, raw: bytes, dialect: Dialect, request_id: str,
        tenant: Tenant, settings: Settings, trace: _Trace, backend: Backend, plan: RoutePlan,
        route_headers: dict[str, str], *, retried: bool = False,
    ) -> web.StreamResponse:
        """Admit the request on ``backend``'s pool and forward it; raises BackendFailed when the backend failed
        before anything was sent to the client (its permit released: another backend may take the request), and
        GpuOutOfMemory when it ran out of GPU memory (``retried``: then it is a 503, loads/oom.py)."""
        model = await self._registry.target_model(backend, parsed.model)
        if not reserves_kv(backend.kind, parsed.operation):  # an embedding on Ollama: its model's load is gated
            return await self._serve_unreserved(request, raw, dialect, request_id, tenant, trace, backend, model,
                                                plan, route_headers)
        try:
            pool = await self._admitter.pool_for(backend, model)
        except (BackendNotReady, BackendUnavailable) as exc:  # BackendDown: refused at once, it is not up
            raise BackendFailed(backend, exc) from None
        if pool is not None and backend.kind is BackendKind.OLLAMA and parsed.num_ctx_field is None:
            pool = await self._admitter.pool_at_default(backend, pool)  # /v1 reloads at Ollama's default context
        model = trace.model = pool.model if pool is not None and pool.model else model  # "": a server's one pool
        trace.pool = pool.key if pool is not None else None
        claim = self._admitter.claim(backend, pool)  # the model is not unloaded under this request
        try:
            count = trace.count = await self._counter.count(parsed, backend, model)
            checked = usage_counts_prompt(parsed, count)  # the reply's usage is checked for a truncation
            if not plan.retrying and trace.rate_charge is None:  # once per request, not per backend or retry
                trace.rate_charge = await take_rate(self._rates, tenant, count, reserved_output(
                    parsed, tenant, settings.admission.default_output_tokens))
            counted = checked or (trace.rate_charge is not None and trace.rate_charge.counts_tokens)
            observer = trace.usage = UsageObserver() if counted else trace.usage
            trace.admitting = True
            fit = self._fit_policy(settings, tenant, model)
            admitted = await self._admitter.admit(
                parsed, raw, pool, count, tenant, lambda: _gone(request),
                lambda changed: self._counter.count(
                    changed, backend, model, budget_s=settings.counting.refusal_count_wait_s),
                fit,
                request_deadline(request.headers),
            )
            trace.outcome, trace.admitting = admitted.outcome, False
            plan.admitted()  # the ledger holds it now; its service time starts
            try:
                headers = {**response_headers(admitted.outcome), **route_headers}
                notice = None if pool is None else reply_notice(parsed, admitted.outcome, pool.slot_ctx_tokens,
                                                                enabled=fit.notice)
                try:
                    with fenced(self._fences(), admitted.lease) as fence:  # shared ledger: ended before it expires
                        response = await self._forward(
                            request, backend, admitted.body, dialect, request_id, headers, observer,
                            admitted.outcome.forwarded_count if checked else None, notice,
                            wait_restart=not plan.routed,  # else: the next backend
                            catch_oom=self._admitter.gates_loads(backend), fence=fence)
                except (BackendUnavailable, BackendTimeout) as exc:  # nothing was sent: the client waits on
                    raise BackendFailed(backend, exc) from None
                except GpuOutOfMemory as oom:
                    self._admitter.model_may_have_reloaded(backend, model)  # the runner may be gone: read anew
                    if retried:
                        raise oom_refusal(backend.describe(), model, oom.words, retried=True) from None
                    oom.model = model
                    raise
            finally:
                admitted.release()
                if backend.kind is BackendKind.OLLAMA and parsed.num_ctx_field is None:
                    self._admitter.model_may_have_reloaded(backend, model, at_default=True)  # /v1: Ollama's default
            if observer is not None and response.status == 200:
                trace.output_tokens = observer.output_tokens()
            if checked and observer is not None and response.status == 200:
                await self._checks.observe(parsed, backend, admitted.outcome, observer.prompt_tokens(), model)
            return response
        finally:
            claim.release()

    async def _serve_unreserved(
        self, request: web.Request, raw: bytes, dialect: Dialect, request_id: str, tenant: Tenant, trace: _Trace,
        backend: Backend, model: str | None, plan: RoutePlan, route_headers: dict[str, str],
    ) -> web.StreamResponse:
        """A request that holds no KV reservation on its backend: its model is loaded through the GPU check when not
        resident, and held resident until the response ends."""
        trace.model = model or "-"
        if not plan.retrying:
            trace.rate_charge = await take_rate(self._rates, tenant, None, 0)
        claim = await self._admitter.hold_model(backend, model)
        try:
            return await self._forward(request, backend, raw, dialect, request_id, route_headers)
        except (BackendUnavailable, BackendTimeout) as exc:  # nothing was sent: another backend may take it
            raise BackendFailed(backend, exc) from None
        finally:
            claim.release()

    async def _backend_for(
        self, request: web.Request, parsed: ParsedRequest, route: Route, tenant: Tenant
    ) -> list[Backend]:
        """The backends that serve the model (routing picks one); kvgate's own summary requests may name one
        (``X-Kvgate-Route-Backend``, ignored on a client's request)."""
        named = request.headers.get(ROUTE_BACKEND_HEADER)
        if named and tenant.name == SUMMARIZER_TENANT and self._internal is not None \
                and self._internal.is_internal(request.headers):
            found = next((b for b in self._registry.backends if b.name == named), None)
            if found is None:
                raise BadRequest(f"fitting.summary_backend names backend {named!r}; kvgate has "
                                 f"{', '.join(b.name for b in self._registry.backends)}")
            return [found]
        return await self._registry.serving(parsed.model, route.kind)

    @staticmethod
    def _fit_policy(settings: Settings, tenant: Tenant, model: str | None) -> FitPolicy:
        """What a request too long for its context may have done to it; kvgate's own summary requests are never
        summarized themselves."""
        policy = policy_for(settings, tenant=tenant.name, model=model)
        return policy.without_summaries() if tenant.name == SUMMARIZER_TENANT else policy

    def _fences(self) -> Fences | None:
        shared = self._admitter.room.shared
        return None if shared is None else shared.fences

    def _stream_cut(self, backend: str, reason: str) -> None:
        """A backend's answer broke off mid-way: take it out (``routing.down_s``), as if it had failed before."""
        self._router.failed(backend, f"its answer broke off mid-way: {reason}", self._live.settings.routing)

    async def _forward(
        self,
        request: web.Request,
        backend: Backend,
        body: bytes | AsyncIterator[bytes] | None,
        dialect: Dialect,
        request_id: str,
        headers_out: dict[str, str],
        observer: UsageObserver | None = None,
        forwarded: TokenCount | None = None,
        notice: Notice | None = None,
        *,
        wait_restart: bool = True,
        catch_oom: bool = False,
        fence: FenceSignal | None = None,
    ) -> web.StreamResponse:
        """Send the request to ``backend`` and relay its answer; with an ``observer``, the reply's usage is read on
        the way and a reply held whole names a silent truncation of the ``forwarded`` prompt in a header. A
        ``notice`` goes into the reply (``fitting.notice``), asked of the backend uncompressed."""
        timeouts = backend.settings.timeouts
        headers = upstream_request_headers(
            request.headers, host=backend.host_header, request_id=request_id, api_key=backend.api_key,
            client_ip=request.remote,  # kvgate's keys (a tenant's, the admin's) stay in kvgate
            strip_client_keys=self._live.tenants.enabled or carries_admin_key(request.headers,
                                                                              self._live.settings.server.admin_key),
            body_decoded=isinstance(body, bytes),  # a body kvgate read is forwarded decoded (edge/body/encoding.py)
        )
        if notice is not None:
            headers["Accept-Encoding"] = "identity"  # the reply is rewritten: kvgate must read it
        upstream = await backend.client.open(request.method, request.raw_path, headers, body,
                                             wait_restart=wait_restart)
        try:
            extra = {"X-Kvgate-Backend": backend.name, **headers_out}
            held = await held_unless_oom(upstream, request_id=request_id, extra_headers=extra) if catch_oom else None
            if held is not None:  # a 500 that was no out-of-memory, read whole to tell
                return held
            return await relay(
                request, upstream, dialect=dialect, idle_s=timeouts.idle_s, request_id=request_id,
                backend_label=backend.describe(), extra_headers=extra,
                observer=observer, coalesce_s=self._live.settings.server.stream_coalesce_s,
                held_headers=None if observer is None or forwarded is None
                else functools.partial(self._checks.truncation_header, observer, forwarded),
                on_cut=functools.partial(self._stream_cut, backend.name), notice=notice, fence=fence,
            )
        finally:
            upstream.close()
