"""The admission step: the one call the proxy makes to admit a request on the backend routing chose.

    AdmissionStep.step(exchange) -> Admitted | Refused

    model       the model the backend runs for the name the client gave (backends/registry.py)
    unreserved  a request that holds no KV on this backend (an embedding on Ollama, ``sequence_rules``): its model is
                loaded through the GPU check and held resident; nothing is reserved
    pool        the model's KV pool (kv_pools.py); a request at Ollama's own default context (/v1, no num_ctx) first
                has a model kvgate lowered reloaded at the default
    claim       the model is held resident while the request runs
    count       the prompt's tokens (tokens/prompt_counter.py); the tenant's rate charged once per request
    admit       plan, fit, reserve or wait (admit.py): the body to forward and one AdmissionOutcome

Both answers are data. ``Admitted`` holds everything the request holds (the permit, the claim) and gives it back in
one call, ``release``, exactly once, reading the model's layout anew where the request may have reloaded it.
``Refused`` carries admission's error, and whether it was the backend that failed before anything reached the
client (so routing may try the next one). Errors that are not admission's (a body the counter can't read, a rate
limit, a model the backend does not list) are raised as before and rendered by the error boundary.

What the step learns goes into the exchange (the model, the pool, the count, the outcome, the rate charge), which
observability renders when the request is over.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.admission.admit import NO_CLAIM, AdmitAsk, Admitter, Asker, NoClaim
from gateway.admission.charging import reserved_output, settle_rate, take_rate
from gateway.admission.elastic import Growth
from gateway.admission.exchange import Exchange
from gateway.admission.kv_pools import PoolDirectory
from gateway.admission.outcome import AdmissionOutcome
from gateway.admission.permit import Permit
from gateway.admission.rates import RateLimit
from gateway.admission.rejections import AdmissionRejected
from gateway.admission.shared.fencing import Fences
from gateway.admission.shared.shared_rates import TenantRates
from gateway.admission.slot_watch import SlotWatch
from gateway.admission.types import PoolSpec
from gateway.admission.waiting_room import WaitingRoom
from gateway.backends import Backend, BackendRegistry
from gateway.backends.prober import ProbeError
from gateway.config.settings import Settings
from gateway.domain import ParsedRequest, Rewrites
from gateway.errors import BackendNotReady, BackendUnavailable, GatewayError
from gateway.fitting.policy import FitPolicies, FitPolicy
from gateway.fitting.rewrite import apply_rewrites, encode_body
from gateway.fitting.summary_writer import SUMMARIZER_TENANT
from gateway.loads.gate import Claim, LoadGate
from gateway.loads.oom import room_after_oom
from gateway.runtimes import runtime_for
from gateway.tokens import TokenCount
from gateway.tokens.prompt_counter import PromptCounter

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Refused:
    """A request admission did not let through on this backend."""

    error: GatewayError
    backend_failed: bool = False
    """The backend could not be probed now (down, not ready): nothing reached the client, another may serve it."""

    @property
    def summary_failure(self) -> str | None:
        """Why a summary tried before the refusal failed (``SummaryFailed.reason``); None when none was tried."""
        return self.error.summary_failure if isinstance(self.error, AdmissionRejected) else None


@dataclass(slots=True)
class Admitted:
    """A request let through: the body to forward, what admission did (None for a request that reserves nothing),
    and what it holds until its response ends."""

    body: bytes
    outcome: AdmissionOutcome | None
    pool: PoolSpec | None
    fit: FitPolicy | None
    catches_oom: bool
    """kvgate admits this backend's loads: an out-of-memory answer is kvgate's to tell apart (loads/oom.py)."""
    _permit: Permit | None
    _claim: Claim | NoClaim
    _after: _Reloads | None = None
    _released: bool = False
    growth: Growth | None = None
    """An elastic reservation, followed as the reply streams (the relay feeds it) or through the server's slots
    (``slot_watch``); None: fixed, or none."""
    _slots: SlotWatch | None = None

    @property
    def lease(self) -> int | None:
        """The reservation's id (its lease's, with a shared ledger), None when nothing is reserved."""
        return None if self._permit is None else self._permit.reservation.id

    def release(self, *, out_of_memory: bool = False) -> None:
        """Give back the reservation and the claim, once; ``out_of_memory``: the backend ran out of GPU memory
        running the model, whose runner may be gone (its layout is read anew)."""
        if self._released:
            return
        self._released = True
        try:
            if self.growth is not None:
                self.growth.owner.end(self.growth)
                if self._slots is not None:
                    self._slots.forget(self.growth)
            if self._permit is not None:
                self._permit.release()
            if self._after is not None:
                self._after.after_request(out_of_memory=out_of_memory)
        finally:
            self._claim.release()


@dataclass(frozen=True, slots=True)
class _Reloads:
    """What a request may have done to its model's layout on the backend (Ollama reloads at a new context)."""

    step: AdmissionStep
    backend: Backend
    model: str | None
    at_default: bool
    """The request ran at Ollama's own default context (/v1 without num_ctx): the model may be loaded at it now."""
    always: bool = False
    """A load request: whatever happened, the model's layout is read anew."""

    def after_request(self, *, out_of_memory: bool) -> None:
        if out_of_memory or self.always:
            self.step.model_may_have_reloaded(self.backend, self.model)
        if self.at_default:
            self.step.model_may_have_reloaded(self.backend, self.model, at_default=True)


class AdmissionStep:
    """The pools, the load gate and the admitter, behind one call per request (module docstring). ``pools`` and
    ``loads`` are public for routing, which reads what kvgate knows of each backend (gateway/routing/router.py)."""

    def __init__(self, admitter: Admitter, pools: PoolDirectory, registry: BackendRegistry, counter: PromptCounter,
                 rates: TenantRates, loads: LoadGate | None = None) -> None:
        self.admitter = admitter
        self.pools = pools
        self.loads = loads
        self._registry = registry
        self._counter = counter
        self._fit_policies = FitPolicies()
        self._rates = rates
        self.slots = SlotWatch()
        """Elastic replies that are not streamed, read from their server's slots (``slot_watch``)."""

    @property
    def room(self) -> WaitingRoom:
        return self.admitter.room

    async def pool_for(self, backend: Backend, model: str | None) -> PoolSpec | None:
        """The pool a KV-allocating request lands in; None when admission is off or the backend is forwarded
        without it. Raises BackendNotReady (503) rather than answer None for a backend it can't probe now."""
        if not self.admitter.enabled:
            return None
        return await self.pools.pool_for(backend, model)

    def model_may_have_reloaded(self, backend: Backend, model: str | None, *, at_default: bool = False) -> None:
        """After a request that may have (re)loaded a model at another context (``at_default``: at Ollama's own
        default, as /v1 requests do), its layout is read anew."""
        if not model:
            return
        if at_default:
            self.pools.after_default_load(backend, model)
        else:
            self.pools.mark_stale(backend, model)

    def _claim(self, backend: Backend, pool: PoolSpec | None) -> Claim | NoClaim:
        """Hold the pool's model resident while the request runs (released once, when the response ends)."""
        if pool is None or self.loads is None or not pool.model or not self.loads.applies(backend):
            return NO_CLAIM
        return self.loads.claim(backend.name, pool.model)

    def _gates_loads(self, backend: Backend) -> bool:
        """Whether kvgate admits the loads of ``backend`` (an out-of-memory after it did is then kvgate's to
        answer, loads/oom.py; with residency off, the backend's own answer comes back)."""
        return self.loads is not None and self.loads.applies(backend)

    async def _hold_model(self, backend: Backend, model: str | None) -> Claim | NoClaim:
        """For a request that reserves no KV (an embedding on Ollama, ``sequence_rules``): its model loaded through
        the GPU check when it is not resident (``LoadGate.ensure_loaded``), then held resident while it runs."""
        if not self.admitter.enabled or self.loads is None or not model or not self.loads.applies(backend):
            return NO_CLAIM  # admission off: loads are not gated for a chat either (pool_for is not asked)
        try:
            await self.loads.ensure_loaded(backend, model)
        except ProbeError as exc:  # /api/ps can't be read: the request goes on, and meets the backend's own answer
            log.warning("could not check whether model %r is loaded on %s: %s", model, backend.describe(), exc)
        return self.loads.claim(backend.name, model)

    @property
    def counter(self) -> PromptCounter:
        return self._counter

    def reloaded(self, settings: Settings) -> None:
        """Keep the rate buckets of the tenants (and rates) that remain after a reload."""
        self._rates.retain({name: RateLimit(tenant.tokens_per_minute, tenant.requests_per_minute)
                            for name, tenant in settings.tenants.items()})

    async def settle(self, exchange: Exchange) -> None:
        """Once the request is over: charge the tenant's rate what it really generated (charging.settle_rate)."""
        await settle_rate(self._rates, exchange.rate_charge, exchange.usage, exchange.status)
        if exchange.pool is not None and (exchange.status == 200 or exchange.elastic_end is not None):
            output_tokens = exchange.output_tokens if exchange.elastic_end is None else None
            if output_tokens is None and exchange.streamed_tokens is not None:
                output_tokens = exchange.streamed_tokens  # ended by kvgate, or no usage in the reply
            if output_tokens is not None:
                self.admitter.observed(exchange.pool, exchange.tenant.name, output_tokens)

    async def after_oom(self, backend: Backend, model: str, words: str) -> None:
        """The backend ran out of GPU memory before anything reached the client: return when a fresh reading shows
        room for one retry, else raise LoadRefused (503; loads/oom.py)."""
        await room_after_oom(self.loads, backend, model, words, retried=False)

    async def load(self, exchange: Exchange, model: str) -> Admitted | Refused:
        """A load request (an Ollama chat or generate that runs nothing, loads/load_requests.py): the model is loaded
        through the GPU check (its pool, or 503 ``gpu_memory_exhausted``), the body's ``options.num_ctx`` pinned to
        the loaded context so nothing reloads (``admission.pin_num_ctx``), the model held resident while it runs.
        Without admission, or with no pool to read, it is forwarded as sent."""
        backend, parsed = exchange.backend, exchange.parsed
        assert backend is not None, "routing chose the backend before admission"
        after = _Reloads(self, backend, parsed.model, at_default=False, always=True)
        try:
            pool = await self.pool_for(backend, model)  # loads through the GPU check
        except GatewayError as exc:
            after.after_request(out_of_memory=False)
            return Refused(exc)
        body = _raw(exchange)
        if pool is not None and exchange.facts.settings.admission.pin_num_ctx and parsed.num_ctx_field is not None:
            rewritten, _ = apply_rewrites(parsed, Rewrites(num_ctx=pool.slot_ctx_tokens))
            body = body if rewritten is None else encode_body(rewritten)
        return Admitted(body, None, pool, None, False, None, self._claim(backend, pool), after)

    @contextlib.asynccontextmanager
    async def unloading(self, exchange: Exchange) -> AsyncIterator[None]:
        """An unload request (``keep_alive`` 0, the admin's) is forwarded under the backend's load lock, so it never
        lands in the middle of kvgate's own decision and load; the model's layout is read anew after it."""
        backend = exchange.backend
        assert backend is not None, "routing chose the backend before admission"
        lock = None if self.loads is None else self.loads.lock(backend)
        try:
            async with lock if lock is not None else contextlib.nullcontext():
                if lock is not None and lock.held is not None and exchange.parsed.model:
                    lock.held.unloaded(exchange.parsed.model)  # the other replicas read its pool anew after
                yield
        finally:
            self.model_may_have_reloaded(backend, exchange.parsed.model)

    def fences(self) -> Fences | None:
        """The shared ledger's fences (None without one): a request whose lease can't be kept is ended."""
        shared = self.room.shared
        return None if shared is None else shared.fences

    async def step(self, exchange: Exchange) -> Admitted | Refused:
        """Admit the exchange's request on ``exchange.backend`` (module docstring)."""
        backend, parsed = exchange.backend, exchange.parsed
        assert backend is not None, "routing chose the backend before admission"
        model = await self._registry.target_model(backend, parsed.model)
        if not runtime_for(backend).reserves_kv(parsed.operation):
            return await self._unreserved(exchange, backend, model)
        try:
            pool = await self.pool_for(backend, model)
        except (BackendNotReady, BackendUnavailable) as exc:  # BackendDown: refused at once, it is not up
            return Refused(exc, backend_failed=True)
        at_default = _at_ollama_default(backend, parsed)
        if pool is not None and at_default:
            # /v1 reloads at Ollama's default context: a model kvgate lowered is reloaded at the default first,
            # through the GPU check
            pool = await self.pools.before_default_request(backend, pool)
        model = exchange.model = pool.model if pool is not None and pool.model else model  # "": a server's one pool
        exchange.pool = pool.key if pool is not None else None
        claim = self._claim(backend, pool)  # the model is not unloaded under this request
        try:
            return await self._admit(exchange, backend, model, pool, claim, at_default)
        except BaseException:
            claim.release()
            raise

    async def _admit(
        self, exchange: Exchange, backend: Backend, model: str, pool: PoolSpec | None, claim: Claim | NoClaim,
        at_default: bool,
    ) -> Admitted | Refused:
        facts, parsed = exchange.facts, exchange.parsed
        settings = facts.settings
        count = exchange.count = await self._counter.count(parsed, backend, model)
        if exchange.rate_charge is None:  # once per request, not per backend or retry
            exchange.rate_charge = await take_rate(self._rates, exchange.tenant, count, reserved_output(
                parsed, exchange.tenant, settings.admission.default_output_tokens))
        fit = self._fit_policy(exchange, model)
        budget_s = settings.counting.refusal_count_wait_s

        async def recount(changed: ParsedRequest) -> TokenCount:
            return await self._counter.count(changed, backend, model, budget_s=budget_s)

        try:
            ask = AdmitAsk(parsed, _raw(exchange), count, exchange.tenant, fit, exchange.deadline)
            granted = await self.admitter.admit(ask, pool, Asker(exchange.client_gone, recount))
        except GatewayError as exc:
            claim.release()
            return Refused(exc)
        exchange.outcome = granted.outcome
        growth = granted.growth
        if growth is not None and not growth.streamed:
            self.slots.follow(growth, backend)
        return Admitted(granted.body, granted.outcome, pool, fit, self._gates_loads(backend), granted.permit,
                        claim, _Reloads(self, backend, model, at_default), growth=growth, _slots=self.slots)

    async def _unreserved(self, exchange: Exchange, backend: Backend, model: str | None) -> Admitted:
        """A request that holds no KV reservation on its backend: its model is loaded through the GPU check when not
        resident, and held resident until the response ends."""
        exchange.model = model or None
        if exchange.rate_charge is None:
            exchange.rate_charge = await take_rate(self._rates, exchange.tenant, None, 0)
        claim = await self._hold_model(backend, model)
        return Admitted(_raw(exchange), None, None, None, False, None, claim)

    def _fit_policy(self, exchange: Exchange, model: str | None) -> FitPolicy:
        """What a request too long for its context may have done to it; kvgate's own summary requests are never
        summarized themselves."""
        tenant = exchange.tenant
        policy = self._fit_policies.get(exchange.facts.settings, tenant=tenant.name, model=model)
        return policy.without_summaries() if tenant.name == SUMMARIZER_TENANT else policy


def _raw(exchange: Exchange) -> bytes:
    assert exchange.body is not None, "the exchange's body is read before it is admitted"
    return exchange.body.raw


def _at_ollama_default(backend: Backend, parsed: ParsedRequest) -> bool:
    """A request that names no num_ctx on Ollama runs at Ollama's own default context (/v1 requests always do)."""
    return runtime_for(backend).runs_at_default_context(parsed)

