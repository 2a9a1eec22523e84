"""The router: the I/O around ``rank`` (rank.py), the conversations' backends (sticky.py) and the outage book
(outages.py).

For a request whose model several backends serve, ``Router.plan`` reads what each looks like now (read-only: the
pool directory's known pools, the ledger's snapshot and the waiting room's queue length; a llama-server not probed
yet gets ``routing.probe_wait_s`` to answer /props; an Ollama model is resident while the last /api/ps kvgate read
lists it, and where it is not, ``LoadGate.preview`` says what loading it would take: nothing to unload, idle models
to unload, or no load now; without a GPU reading, whether /api/ps lists it) and what it learned of each pool's
service time (``service_times``, from the requests it served) and each backend's loads
(``PoolDirectory.expected_load_s``, from their ``load_duration``), and returns a ``RoutePlan``: the backends in the
order to try (rank.py: by expected time to first token). Requests routed but not admitted yet are counted against
their backend and model (``pending``), for every pool kind and before the pool is known, so a burst that arrives
before any of it reserves spreads instead of piling onto the first backend. A backend that fails before anything
reached the client is taken out (``failed``) and the request moves to the next one, through admission there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.admission import PoolSpec
from gateway.admission.step import AdmissionStep
from gateway.admission.types import PoolKey
from gateway.backends import Backend
from gateway.config.routing import RoutingSettings
from gateway.domain import ParsedRequest
from gateway.errors import GatewayError
from gateway.loads.preview import LoadPreview, PreviewVerdict
from gateway.routing.outages import Outages
from gateway.routing.rank import CandidateView, LoadCost, Ranked, rank
from gateway.routing.service_times import ServiceTimes
from gateway.routing.sticky import StickyMap, conversation_key
from gateway.runtimes import runtime_for
from gateway.tokens.request_count import prompt_bytes

ROUTE_HEADER = "X-Kvgate-Route"
BYTES_PER_TOKEN_GUESS = 3
"""For ranking only (before the request is counted on the chosen backend): a prompt's tokens, leaning high."""


class BackendFailed(Exception):
    """Raised when a backend failed a request before anything was sent to the client (``error`` says how): the
    request may go to another backend."""

    def __init__(self, backend: Backend, error: GatewayError) -> None:
        super().__init__(error.message)
        self.backend = backend
        self.error = error


@dataclass(slots=True)
class _Pending:
    requests: int = 0
    sequences: int = 0
    tokens: int = 0


PendingKey = tuple[str, str]
"""(backend, model as the backend names it; "" for servers of one pool)."""


@dataclass(eq=False)
class RoutePlan:
    """The backends to try for one request, best first; iterate it for (backend, why), moving on only after
    ``failed``. ``settle`` ends the current attempt's pending hold (once admitted, or when it failed)."""

    router: Router
    order: list[tuple[Backend, Ranked]]
    key: str | None
    need_tokens: int
    config: RoutingSettings
    models: dict[str, str] = field(default_factory=dict)
    """The model each backend names it by (the pending hold's and the service time's key)."""
    sequences: int = 1
    started_s: float = 0.0
    _failed: list[str] = field(default_factory=list)
    _held: PendingKey | None = None
    _admitted_s: float | None = None

    def __iter__(self) -> Iterator[tuple[Backend, str]]:
        for index, (backend, ranked) in enumerate(self.order):
            if index > self.config.retries:
                return
            if index > len(self._failed):
                return  # the previous attempt did not fail: nothing more to try
            self.started_s = self.router.now()
            if self._held != self._pending_key(backend.name):
                self._hold(backend.name)
            why = ranked.reason if not self._failed else \
                f"retried after {', '.join(repr(name) for name in self._failed)} failed; {ranked.reason}"
            yield backend, why

    @property
    def retrying(self) -> bool:
        """Whether an earlier backend failed this request."""
        return bool(self._failed)

    @property
    def routed(self) -> bool:
        """Whether there was a choice (more than one candidate): only then does the response say why."""
        return len(self.order) > 1

    def _pending_key(self, name: str) -> PendingKey:
        return name, self.models.get(name, "")

    def _hold(self, name: str) -> None:
        self.settle()
        self._held = key = self._pending_key(name)
        pending = self.router.pending.setdefault(key, _Pending())
        pending.requests += 1
        pending.sequences += self.sequences
        pending.tokens += self.need_tokens

    def settle(self) -> None:
        key, self._held = self._held, None
        if key is None:
            return
        pending = self.router.pending[key]
        pending.requests -= 1
        pending.sequences -= self.sequences
        pending.tokens -= self.need_tokens
        if pending.requests <= 0:
            del self.router.pending[key]

    def admitted(self) -> None:
        """The request holds its reservation now: it no longer counts as on its way, and its service starts."""
        self.settle()
        self._admitted_s = self.router.now()

    def failed(self, failure: BackendFailed) -> bool:
        """Take the backend out; True when another backend is left to try."""
        self.settle()
        self._admitted_s = None  # its service there ended in a failure: not a service time
        name = failure.backend.name
        self.router.failed(name, failure.error.message, self.config)
        self._failed.append(name)
        more = len(self._failed) < len(self.order) and len(self._failed) <= self.config.retries
        if more:
            self.router.retries_total[name] = self.router.retries_total.get(name, 0) + 1
        return more

    def served(self, backend: Backend, status: int = 200) -> None:
        """The backend answered: it is in (when it failed before this attempt began), and keeps the conversation; an
        answer (200) that was admitted adds its admitted-to-released seconds to the pool's service times."""
        self.settle()
        if status == 200 and self._admitted_s is not None:
            self.router.service_times.record(backend.name, self.models.get(backend.name, ""),
                                             self.router.now() - self._admitted_s)
        self.router.outages.succeeded(backend.name, since_s=self.started_s)
        if self.key is not None and self.config.sticky:
            self.router.sticky.remember(self.key, backend.name)


_ONLY_STANDING = CandidateView("").standing()
"""The standing of a backend that is the only one serving a model: what rank() gives a view it knows nothing of."""


class Router:
    def __init__(self, admission: AdmissionStep, clock: Callable[[], float] = time.monotonic) -> None:
        self._admission = admission  # what kvgate knows of each backend: its pools, its loads, its queues
        self.now = clock
        self.outages = Outages(clock)
        self.sticky = StickyMap(max_entries=10_000, ttl_s=600.0, clock=clock)
        self.pending: dict[PendingKey, _Pending] = {}
        self.service_times = ServiceTimes()
        self.retries_total: dict[str, int] = {}

    async def plan(self, parsed: ParsedRequest, backends: list[Backend], config: RoutingSettings,
                   default_output_tokens: int) -> RoutePlan:
        """The order to try ``backends`` in for ``parsed`` (one backend: that one, nothing read)."""
        need = parsed.sequences * (prompt_bytes(parsed.prompt_input) // BYTES_PER_TOKEN_GUESS
                                   + (parsed.output.tokens or default_output_tokens))
        models = {backend.name: _model_key(backend, parsed.model) for backend in backends}
        if len(backends) == 1:
            only = Ranked(backends[0].name, _ONLY_STANDING, False, "only")  # nothing to compare: no ranking
            return RoutePlan(self, [(backends[0], only)], None, need, config, models, parsed.sequences)
        self.sticky.configure(max_entries=config.sticky_entries, ttl_s=config.sticky_ttl_s)
        key = conversation_key(parsed) if config.sticky else None
        looks = await asyncio.gather(*(self._look(backend, models[backend.name], config) for backend in backends))
        # from here to the hold, nothing awaits: the next request's ranking sees this one on its way
        views = [self._view(backend, models[backend.name], look, need, parsed.sequences, config)
                 for backend, look in zip(backends, looks, strict=True)]
        by_name = {backend.name: backend for backend in backends}
        ranked = rank(views, sticky=self.sticky.get(key) if key is not None else None,
                      sticky_slack_s=config.sticky_slack_s)
        plan = RoutePlan(self, [(by_name[entry.name], entry) for entry in ranked], key, need, config, models,
                         parsed.sequences)
        plan._hold(ranked[0].name)
        return plan

    def failed(self, backend: str, reason: str, config: RoutingSettings) -> None:
        self.outages.failed(backend, reason, down_s=config.down_s, max_down_s=config.max_down_s)

    def status(self, backend: str) -> dict[str, object]:
        """The backend's routing state for the status page: seconds it stays out (None: in), why, how many times it
        was taken out and how many requests moved on from it since start."""
        outage = self.outages.current().get(backend)
        return {
            "out_for_s": None if outage is None else round(max(0.0, outage.out_until_s - self.now()), 1),
            "out_reason": None if outage is None else outage.reason,
            "outages": self.outages.outages_total.get(backend, 0),
            "retries": self.retries_total.get(backend, 0),
        }

    def _view(self, backend: Backend, model: str, look: _Look, need_tokens: int, sequences: int,
              config: RoutingSettings) -> CandidateView:
        """The backend as rank.py weighs it: its pool's slots, busy sequences and free tokens (with what is on its
        way there), the requests ahead not admitted yet, and the learned service and load times."""
        pending = self.pending.get((backend.name, model), _Pending())
        service_s = self.service_times.expected_s(backend.name, model) or config.default_service_s
        base = CandidateView(backend.name, resident=look.resident, out=self.outages.is_out(backend.name),
                             waiting=pending.sequences, need_tokens=need_tokens, sequences=sequences,
                             service_s=service_s, slots_guess=self._slots_guess(backend, model))
        pool = look.pool
        if pool is None:  # admission off, not probed, or not loaded: the requests on their way there are its queue
            return replace(base, load=self._load(backend, model, look, config))
        room = self._admission.room
        snapshot = room.pool_snapshot(PoolKey(pool.backend, pool.model))  # with the other replicas' (shared)
        return replace(
            base, resident=True, unified=pool.unified, slots=pool.slots, busy=snapshot.active_sequences,
            waiting=max(pending.sequences, room.queue_length(pool.key)),
            free_tokens=pool.pool_tokens - snapshot.reserved_tokens - pending.tokens,
        )

    def _load(self, backend: Backend, model: str, look: _Look, config: RoutingSettings) -> LoadCost | None:
        """What a load of ``model`` on ``backend`` would take, with its expected seconds; None when resident."""
        if look.resident:
            return None
        learned = self._admission.pools.expected_load_s(backend, model)
        load_s = config.default_load_s if learned is None else learned[0]
        if look.load is not None:
            return replace(look.load, load_s=load_s)
        return LoadCost(load_s=load_s, checked=False, waits_for_busy=self._busy_elsewhere(backend, model))

    def _busy_elsewhere(self, backend: Backend, model: str) -> bool:
        """Whether another model runs on ``backend`` through kvgate now (a load there may have to wait for it)."""
        ledger = self._admission.room.ledger
        return any(pool.model != model and ledger.snapshot(pool.key).active_sequences > 0
                   for (name, _), pool in self._admission.pools.known().items() if name == backend.name)

    def _slots_guess(self, backend: Backend, model: str) -> int:
        """The slots a pool not probed yet is counted on: configured, else the backend's learned parallel, else the
        fewest the same model has elsewhere, else one."""
        learned = backend.settings.parallel or self._admission.pools.slots.learned_parallel(backend.name)
        if learned is not None:
            return learned
        elsewhere = [pool.slots for (name, other), pool in self._admission.pools.known().items()
                     if name != backend.name and other == model]
        return min(elsewhere) if elsewhere else 1

    async def _look(self, backend: Backend, name: str, config: RoutingSettings) -> _Look:
        """What the backend looks like for ``model``: its pool when kvgate knows it (a llama-server or configured
        server not probed yet gets ``probe_wait_s``); an Ollama model's only while resident (probing it would load
        it), else what loading it would take (``LoadGate.preview``, within ``probe_wait_s``)."""
        if not runtime_for(backend).probe_loads_model:
            known = self._admission.pools.known().get((backend.name, ""))
            if known is not None or self.outages.is_out(backend.name):
                return _Look(known)
            with contextlib.suppress(GatewayError, TimeoutError):
                return _Look(await asyncio.wait_for(self._admission.pool_for(backend, ""), config.probe_wait_s))
            return _Look(None)
        known = self._admission.pools.known().get((backend.name, name))
        if known is not None:
            if not self._evicted(backend, known):
                return _Look(known)
            self._admission.model_may_have_reloaded(backend, name)  # its next request loads it through the gate
        if self.outages.is_out(backend.name):
            return _Look(None, resident=False)
        with contextlib.suppress(TimeoutError):
            preview = await asyncio.wait_for(self._preview(backend, name), config.probe_wait_s)
            if preview.verdict is PreviewVerdict.RESIDENT:
                return _Look(None)
            return _Look(None, resident=False, load=_load_cost(preview))
        return _Look(None, resident=False)

    async def _preview(self, backend: Backend, model: str) -> LoadPreview:
        """What loading ``model`` on ``backend`` would take now (``LoadGate.preview``: nothing is locked, claimed or
        loaded)."""
        loads = self._admission.loads
        return LoadPreview.unknown("no load gate") if loads is None else await loads.preview(backend, model)

    def _evicted(self, backend: Backend, pool: PoolSpec) -> bool:
        """A pool kvgate probed whose model the last /api/ps no longer lists (Ollama unloaded it since: idle past
        its keep_alive, or evicted for another model), with nothing of kvgate's running on it."""
        loads = self._admission.loads
        if loads is None or loads.resident(backend.name, pool.model) is not False:
            return False
        return self._admission.room.ledger.snapshot(PoolKey(pool.backend, pool.model)).active_sequences == 0


@dataclass(frozen=True, slots=True)
class _Look:
    """One backend as ``Router._look`` found it: its pool (None: unknown), whether the model is resident, and for a
    model that is not, what loading it would take (None: unknown)."""

    pool: PoolSpec | None
    resident: bool = True
    load: LoadCost | None = None


def _model_key(backend: Backend, model: str | None) -> str:
    """The model part of ``backend``'s pool key for ``model``, as the backend names it (Ollama's pools are per
    model; the other kinds have one pool: "")."""
    return runtime_for(backend).pool_model(backend.listed_name(model or "") or model or "")


def _load_cost(preview: LoadPreview) -> LoadCost | None:
    if preview.verdict is PreviewVerdict.FITS:
        return LoadCost()
    if preview.verdict is PreviewVerdict.EVICTS:
        return LoadCost(evict_bytes=preview.evict_bytes, evict_models=len(preview.evict_models))
    if preview.verdict is PreviewVerdict.CANNOT:
        return LoadCost(possible=False)
    return None


class RouteCollector(Collector):
    """``kvgate_backend_out``, ``kvgate_backend_outages_total`` and ``kvgate_route_retries_total``, per backend."""

    def __init__(self, router: Router, backends: Callable[[], list[str]]) -> None:
        self._router = router
        self._backends = backends

    def collect(self) -> Iterator[Metric]:
        out = GaugeMetricFamily("kvgate_backend_out", "1 while the backend is taken out after failing",
                                labels=["backend"])
        outages = CounterMetricFamily("kvgate_backend_outages", "Times the backend was taken out", labels=["backend"])
        retries = CounterMetricFamily("kvgate_route_retries", "Requests retried on another backend after this one "
                                      "failed before answering", labels=["backend"])
        router = self._router
        for name in self._backends():
            out.add_metric([name], int(router.outages.is_out(name)))
            outages.add_metric([name], router.outages.outages_total.get(name, 0))
            retries.add_metric([name], router.retries_total.get(name, 0))
        yield from (out, outages, retries)
