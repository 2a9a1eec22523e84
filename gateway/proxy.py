"""The one orchestrator of the request path (design.md section 3); each step lives in the module named beside it.

    read the body        body/reader.py          decoded, bounded, held under the request's lease (body/budget.py)
    parse                dialects/               once, into a frozen ParsedRequest (domain.py)
    tenant               admission/tenants.py    API key to tenant and its caps
    route                backends/registry.py    the backends serving the model, and their own names for it;
                         routing/                which of them: ranked by memory, sticky by conversation, a
                                                 backend that fails before answering is retried elsewhere
    find the pool        admission/pools.py      the model's KV pool, probed through backends/probes.py
    count                tokens/prompt_counter.py  the prompt's tokens, exact where a counter can
    admit                admission/admit.py      plan (planner.py, pure), fit (fitting/), reserve or wait
                                                 (waiting_room.py, ledger.py): one AdmissionOutcome (outcome.py)
    forward              backends/client.py      the backend's one client: auth, Host, timeouts, transport errors
    stream back          streaming.py            bytes pass through; usage observed (observability/usage.py)
    release + observe    here, reply_checks.py   the permit is released; truncation checked
                                                 (observability/truncation.py); calibration; metrics and the
                                                 log line rendered from the outcome (observability/metrics.py)
    listings             listing.py              /api/tags, /api/ps, /v1/models: every backend's list, merged

Errors are raised as ``gateway.errors`` and rendered once, here, in the dialect of the request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web

from gateway import dialects
from gateway.admission import AdmissionRejected
from gateway.admission.admit import Admitter
from gateway.admission.outcome import AdmissionOutcome, response_headers
from gateway.admission.rates import RateLimit
from gateway.admission.sequence_rules import reserves_kv
from gateway.admission.shared.rates import TenantRates
from gateway.admission.tenants import Tenant
from gateway.admission.types import PoolKey
from gateway.backends import Backend, BackendRegistry
from gateway.body.budget import BodyBudget, BodyLease
from gateway.body.reader import read_body
from gateway.config import Settings
from gateway.domain import KV_OPERATIONS, BackendKind, Dialect, Operation, ParsedRequest
from gateway.errors import (
    BackendNotReady,
    BackendTimeout,
    BackendUnavailable,
    BadRequest,
    GatewayError,
    InternalError,
    RateLimited,
)
from gateway.fitting.policy import FitPolicy, policy_for
from gateway.fitting.summarizer import ROUTE_BACKEND_HEADER, SUMMARIZER_TENANT, InternalCalls
from gateway.headers import REQUEST_ID, request_deadline, upstream_request_headers
from gateway.listing import merged_listing
from gateway.notice import Notice, reply_notice
from gateway.observability.logs import ClientText, request_id_var
from gateway.observability.metrics import Metrics, record
from gateway.observability.request_log import logged_content, request_fields
from gateway.observability.tenant_usage import UNIDENTIFIED, refusal_reason
from gateway.observability.usage import UsageObserver
from gateway.reload import LiveSettings
from gateway.reply_checks import ReplyChecks, usage_counts_prompt
from gateway.routes import FALLBACK, Handling, Route, fallback_dialect
from gateway.routing import ROUTE_HEADER, BackendFailed, RouteCollector, RoutePlan, Router
from gateway.streaming import relay
from gateway.tokens import TokenCount
from gateway.tokens.prompt_counter import PromptCounter

log = logging.getLogger("gateway.proxy")

MAX_REQUEST_ID_CHARS = 128


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def request_id_for(request: web.Request) -> str:
    """The client's X-Request-ID when it is sane, otherwise a new one."""
    given = request.headers.get(REQUEST_ID, "")
    if 0 < len(given) <= MAX_REQUEST_ID_CHARS and given.isprintable() and given.isascii():
        return given
    return uuid.uuid4().hex


def _error_headers(error: GatewayError, request_id: str) -> dict[str, str]:
    headers = {REQUEST_ID: request_id}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(error.retry_after_s)))
    return headers


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
        self._live = live  # the settings and tenants of new requests; a reload replaces them (gateway/reload.py)
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
        self._bodies = BodyBudget(int(server.max_held_body_bytes), wait_s=server.held_body_wait_s)
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
        request_id = request_id_for(request)
        token = request_id_var.set(request_id)
        dialect = fallback_dialect(request.path) if route is FALLBACK else route.dialect
        started_s = self._clock()
        status = 0
        detail: dict[str, object] = {"tenant": UNIDENTIFIED}  # until the key names one
        trace = _Trace()
        lease = self._bodies.lease()  # the body bytes this request holds, given back when it is over
        try:
            internal = self._internal is not None and self._internal.is_internal(request.headers)
            tenant = Tenant(SUMMARIZER_TENANT) if internal else self._live.tenants.identify(request.headers)
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
        return web.Response(
            status=error.status,
            body=dialects.error_body(dialect, error),
            content_type="application/json",
            headers=_error_headers(error, request_id),
        )

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
        parsed = dialects.parse(dialect, route.operation, dialects.decode_body(raw), request.path)
        trace.asked_model = parsed.model
        if settings.server.log_contents:
            trace.content = logged_content(parsed)
        backends = await self._backend_for(request, parsed, route, tenant)
        backend = backends[0]
        trace.backend = backend.name
        if not parsed.allocates_kv:
            try:
                return await self._forward(request, backend, raw, dialect, request_id, {})
            finally:
                self._after_load_request(parsed, backend)
        plan = await self._router.plan(parsed, backends, settings.routing, settings.admission.default_output_tokens)
        for backend, why in plan:  # the next one only after the last failed before anything reached the client
            trace.backend = backend.name
            try:
                response = await self._serve(request, parsed, raw, dialect, request_id, tenant, settings, trace,
                                             backend, plan, {ROUTE_HEADER: why} if plan.routed else {})
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
        route_headers: dict[str, str],
    ) -> web.StreamResponse:
        """Admit the request on ``backend``'s pool and forward it; raises BackendFailed when the backend failed
        before anything was sent to the client (its permit released: another backend may take the request)."""
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
            observer = UsageObserver() if usage_counts_prompt(parsed, count) else None  # truncation check
            if not plan.retrying:  # the tenant's rate is taken once per request, not once per backend tried
                await self._take_rate(tenant, count)
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
                    response = await self._forward(request, backend, admitted.body, dialect, request_id, headers,
                                                   observer, admitted.outcome.forwarded_count, notice,
                                                   wait_restart=not plan.routed)  # else: the next backend, now
                except (BackendUnavailable, BackendTimeout) as exc:  # nothing was sent: the client waits on
                    raise BackendFailed(backend, exc) from None
            finally:
                admitted.release()
                if backend.kind is BackendKind.OLLAMA and parsed.num_ctx_field is None:
                    self._admitter.model_may_have_reloaded(backend, model, at_default=True)  # /v1: Ollama's default
            if observer is not None and response.status == 200:
                trace.output_tokens = observer.output_tokens()
                await self._rates.settle(tenant.name, tenant.rate, trace.output_tokens or 0, time.monotonic())
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
            await self._take_rate(tenant, None)
        claim = await self._admitter.hold_model(backend, model)
        try:
            return await self._forward(request, backend, raw, dialect, request_id, route_headers)
        except (BackendUnavailable, BackendTimeout) as exc:  # nothing was sent: another backend may take it
            raise BackendFailed(backend, exc) from None
        finally:
            claim.release()

    async def _take_rate(self, tenant: Tenant, count: TokenCount | None) -> None:
        """The tenant's tokens and requests per minute: 429 with Retry-After when over; 400 for a counted prompt
        larger than a whole minute's tokens (waiting would not help). An estimate never refuses: it is charged at
        most a whole minute's tokens (it may wait for a full bucket)."""
        prompt_tokens = count.tokens if count is not None else 0
        per_minute = tenant.rate.tokens_per_minute
        if count is not None and not count.exact and per_minute is not None:
            prompt_tokens = min(prompt_tokens, per_minute)
        refused = await self._rates.take(tenant.name, tenant.rate, prompt_tokens, time.monotonic())
        if refused is None:
            return
        if math.isinf(refused.retry_after_s):
            raise BadRequest(f"{refused.reason}; shorten the prompt or ask for a higher rate")
        raise RateLimited(f"{refused.reason}; retry in {math.ceil(refused.retry_after_s)} s",
                          retry_after_s=max(1.0, math.ceil(refused.retry_after_s)))

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

    def _after_load_request(self, parsed: ParsedRequest, backend: Backend) -> None:
        """An Ollama chat or generate without a prompt loads (or unloads) the model: its context is read anew."""
        if backend.kind is BackendKind.OLLAMA and parsed.operation in KV_OPERATIONS and parsed.model:
            self._admitter.model_may_have_reloaded(backend, parsed.model)

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
    ) -> web.StreamResponse:
        """Send the request to ``backend`` and relay its answer; with an ``observer``, the reply's usage is read on
        the way and a reply held whole names a silent truncation of the ``forwarded`` prompt in a header. A
        ``notice`` goes into the reply (``fitting.notice``), asked of the backend uncompressed."""
        timeouts = backend.settings.timeouts
        headers = upstream_request_headers(
            request.headers, host=backend.host_header, request_id=request_id, api_key=backend.api_key,
            client_ip=request.remote, strip_client_keys=self._live.tenants.enabled,
            body_decoded=isinstance(body, bytes),  # a body kvgate read is forwarded decoded (gateway.body.encoding)
        )
        if notice is not None:
            headers["Accept-Encoding"] = "identity"  # the reply is rewritten: kvgate must read it
        upstream = await backend.client.open(request.method, request.raw_path, headers, body,
                                             wait_restart=wait_restart)
        try:
            return await relay(
                request, upstream, dialect=dialect, idle_s=timeouts.idle_s, request_id=request_id,
                backend_label=backend.describe(), extra_headers={"X-Kvgate-Backend": backend.name, **headers_out},
                observer=observer, coalesce_s=self._live.settings.server.stream_coalesce_s,
                held_headers=None if observer is None or forwarded is None
                else functools.partial(self._checks.truncation_header, observer, forwarded),
                on_cut=functools.partial(self._stream_cut, backend.name), notice=notice,
            )
        finally:
            upstream.close()
