"""Prometheus metrics: what kvgate decided, per request, and the live state of every KV pool and queue.

Request-level counters are recorded at the proxy's one boundary, from the admission outcome (never from headers: a
backend may send headers of the same names); truncations once a reply has ended. Pool and queue gauges are read from
the waiting room when scraped (``GET /kvgate/metrics``), so they can never drift from the ledger.

    kvgate_requests_total{route,backend,status}          requests answered, by route template
    kvgate_tenant_requests_total{tenant,status}          requests answered, by tenant
    kvgate_tenant_prompt_tokens_total{tenant}            prompt tokens kvgate forwarded (its count, after any trim)
    kvgate_tenant_output_tokens_total{tenant}            output tokens the backend reported (none when it did not)
    kvgate_tenant_refusals_total{tenant,reason}          refused by kvgate itself (tenant_usage.refusal_reason)
    kvgate_tenant_queue_seconds_total{tenant}            summed queue waits of admitted requests
    kvgate_request_duration_seconds{route}               time to the end of the response
    kvgate_prompt_tokens_total{backend,counter,exact}    prompt tokens counted
    kvgate_decisions_total{backend,decision}             one request, once, in each that applies: admitted |
                                                         queued | forwarded_without_pool | rewritten | clamped |
                                                         pinned | context_lowered | trimmed | summarized |
                                                         summary_failed | refused (observability/outcomes.py)
    kvgate_truncations_total{backend,model}              replies whose reported prompt is short of kvgate's count
    kvgate_pool_active_sequences{backend,model}          sequences holding a reservation now, on every replica
    kvgate_pool_reserved_tokens{backend,model}           KV cells reserved now, on every replica (shared ledger)
    kvgate_pool_active_sequences_local{backend,model}    ... of them, this replica's (the same without a shared ledger)
    kvgate_pool_reserved_tokens_local{backend,model}     ... of them, this replica's
    kvgate_pool_capacity_tokens{backend,model}           the pool's size
    kvgate_queue_length{backend,model}                   requests waiting now (here)
    kvgate_queue_wait_seconds_total{backend,model}       summed waits of admitted requests
    kvgate_queue_rejected_total{backend,model,reason}    final refusals: queue_full | queue_timeout | context (a chat
                                                         trimmed or summarized and served is none)
    kvgate_pool_refusals_total{backend,model,reason}     every final refusal of a request planned in the pool
    kvgate_summary_failures_total{reason}                summaries tried that failed: timeout | error | too_long |
                                                         no_fit (the request was trimmed or refused)
    kvgate_gpu_total_bytes{backend}                      device memory of the backend's GPUs (its vram source)
    kvgate_gpu_model_bytes{backend,model}                each resident model's bytes (reported or estimated)
    kvgate_gpu_other_processes_bytes{backend}            used beyond the resident models (foreign processes)
    kvgate_gpu_reserved_bytes{backend}                   held for model loads in flight
    kvgate_gpu_free_bytes{backend}                       total - resident - other - reserved, at least 0
    kvgate_gpu_overcommitted{backend}                    1 when resident + other + reserved exceed the total
    kvgate_config_reloads_total{outcome}                 configuration reloads: ok | refused (gateway/config/reload.py)
    kvgate_backend_out{backend}                          1 while routing holds a failed backend out (gateway/routing/)
    kvgate_backend_outages_total{backend}                times it was taken out
    kvgate_route_retries_total{backend}                  requests moved to another backend after it failed

A request's counters are added up in a plain dict (``Metrics.count``) and handed to prometheus-client when the
registry is read (a scrape, ``get_sample_value``): its ``inc`` takes a lock and checks the metric on every call,
about 7% of the instructions of a small chat's path, measured (bench.instructions).

GPU gauges come from the last budget the app computed (on a status read, and in the refresh loop), never from I/O
during a scrape. Every ``model`` label is bounded: pool labels are pool keys, the truncation counter's is the name
the backend lists (``truncations.model_label``), the GPU ledger's the names the backend lists as resident, never a
client's string as sent; every ``tenant`` label a configured name, ``anonymous``, ``kvgate-summarizer`` or "-" (no
tenant: a bad key). Every label value is safe text (``gateway.support.safe_text.safe_text``): one that could not be
encoded would fail every later scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.admission import PoolKey, PoolSpec, WaitingRoom
from gateway.admission.exchange import Exchange
from gateway.admission.outcome import AdmissionOutcome
from gateway.fitting.summaries import Summaries
from gateway.fitting.summary_fit import SUMMARY_FAILURES
from gateway.loads.gate import LoadCounts
from gateway.loads.gpu_ledger import GpuBoard
from gateway.observability.decisions import DecisionLog
from gateway.observability.outcomes import QUEUE_REASONS, OutcomeTally, request_decisions
from gateway.observability.prompts_seen import LongestPrompts
from gateway.observability.tenant_usage import UNIDENTIFIED, TenantUsage
from gateway.observability.truncation import Truncation
from gateway.observability.truncations import TruncationLog
from gateway.support.safe_text import safe_text

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _labels(values: tuple[str, ...]) -> list[str]:
    return [safe_text(value) for value in values]


class _PoolCollector(Collector):
    def __init__(self, room: WaitingRoom, pools: Callable[[], dict[tuple[str, str], PoolSpec]],
                 outcomes: OutcomeTally) -> None:
        self._room = room
        self._pools = pools
        self._outcomes = outcomes

    def collect(self) -> Iterator[Metric]:
        labels = ["backend", "model"]
        active = GaugeMetricFamily("kvgate_pool_active_sequences", "Sequences holding a reservation (every replica)",
                                   labels=labels)
        reserved = GaugeMetricFamily("kvgate_pool_reserved_tokens", "KV cells reserved now (every replica)",
                                     labels=labels)
        active_here = GaugeMetricFamily("kvgate_pool_active_sequences_local", "Sequences this replica holds",
                                        labels=labels)
        reserved_here = GaugeMetricFamily("kvgate_pool_reserved_tokens_local", "KV cells this replica reserved",
                                          labels=labels)
        capacity = GaugeMetricFamily("kvgate_pool_capacity_tokens", "KV cells in the pool", labels=labels)
        queued = GaugeMetricFamily("kvgate_queue_length", "Requests waiting for the pool", labels=labels)
        waited = CounterMetricFamily("kvgate_queue_wait_seconds", "Summed waits of admitted requests",
                                     labels=labels)
        rejected = CounterMetricFamily("kvgate_queue_rejected", "Requests finally refused for the queue or the "
                                       "context (never one trimmed and served)", labels=[*labels, "reason"])
        refusals = CounterMetricFamily("kvgate_pool_refusals", "Requests kvgate refused, by reason",
                                       labels=[*labels, "reason"])
        known = self._pools()
        for key, pool in known.items():
            capacity.add_metric(_labels(key), pool.pool_tokens)
        room, ledger = self._room, self._room.ledger
        stats = room.stats()
        tally = self._outcomes
        for key in {*(PoolKey(*k) for k in known), *ledger.keys(), *stats, *tally.keys()}:
            total, here = room.pool_snapshot(key), ledger.snapshot(key)
            active.add_metric(_labels(key), total.active_sequences)
            reserved.add_metric(_labels(key), total.reserved_tokens)
            active_here.add_metric(_labels(key), here.active_sequences)
            reserved_here.add_metric(_labels(key), here.reserved_tokens)
            counts = tally.pool(key).refusals
            for reason, label in QUEUE_REASONS.items():
                rejected.add_metric([*_labels(key), label], counts.get(reason, 0))
            for reason, count in counts.items():
                refusals.add_metric([*_labels(key), reason], count)
        for key, stat in stats.items():
            queued.add_metric(_labels(key), stat.queued)
            waited.add_metric(_labels(key), stat.waited_s_total)
        yield from (active, reserved, active_here, reserved_here, capacity, queued, waited, rejected, refusals)


class _SummaryCollector(Collector):
    def __init__(self, summaries: Summaries) -> None:
        self._summaries = summaries

    def collect(self) -> Iterator[Metric]:
        cache = self._summaries.cache
        summarizer = self._summaries.summarizer
        for name, doc, value in (
            ("kvgate_summary_cache_hits", "Summaries reused from the cache", cache.hits),
            ("kvgate_summary_cache_misses", "Summary cache lookups that found none", cache.misses),
            ("kvgate_summary_calls", "Summaries asked of the summary model", summarizer.calls),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        failures = CounterMetricFamily("kvgate_summary_failures", "Summaries tried that failed, by reason (the "
                                       "request was trimmed or refused)", labels=["reason"])
        for reason in SUMMARY_FAILURES:
            failures.add_metric([reason], self._summaries.failures.get(reason, 0))
        yield failures
        yield GaugeMetricFamily("kvgate_summary_cache_entries", "Summaries in the cache", value=len(cache))


class _LoadCollector(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, LoadCounts]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        families = {
            field: CounterMetricFamily(f"kvgate_model_{field}", doc, labels=["backend"])
            for field, doc in (("loads", "Model loads kvgate let happen (GPU memory checked first)"),
                               ("unloads", "Idle models kvgate unloaded to make room"),
                               ("lowered", "Loads at a context lowered to fit GPU memory"),
                               ("waited", "Loads that waited for GPU memory"),
                               ("refused", "Loads refused: they would overrun GPU memory"))
        }
        for backend, counts in self._counts().items():
            for field, family in families.items():
                family.add_metric(_labels((backend,)), getattr(counts, field))
        yield from families.values()


class _GpuCollector(Collector):
    def __init__(self, board: GpuBoard) -> None:
        self._board = board

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, *extra: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["backend", *extra])

        total = gauge("kvgate_gpu_total_bytes", "Device memory of the backend's GPUs")
        free = gauge("kvgate_gpu_free_bytes", "Device memory neither resident, used by others, nor reserved")
        other = gauge("kvgate_gpu_other_processes_bytes", "Device memory used beyond the resident models")
        model = gauge("kvgate_gpu_model_bytes", "Device memory of one resident model", "model")
        reserved = gauge("kvgate_gpu_reserved_bytes", "Device memory held for loads in flight")
        over = gauge("kvgate_gpu_overcommitted", "1 when resident + other + reserved exceed the total")
        for backend, entry in self._board.entries().items():
            budget = entry.budget
            if budget is None:
                continue
            labels = _labels((backend,))
            total.add_metric(labels, budget.total_bytes)
            free.add_metric(labels, budget.free_bytes)
            other.add_metric(labels, budget.other_processes_bytes)
            reserved.add_metric(labels, budget.reserved_bytes)
            over.add_metric(labels, int(budget.overcommitted))
            for resident in budget.residents:
                model.add_metric(_labels((backend, resident.name)), resident.resident_bytes)
        yield from (total, free, other, model, reserved, over)


class _Flush(Collector):
    """Registered first: every read of the registry counts what requests added since the last one."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        self._metrics.flush()
        yield from ()


class Metrics:
    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._pending: dict[Any, float] = {}
        """Counts added per child since the registry was last read (``count``, ``flush``)."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Flush(self))
        self.requests = Counter("kvgate_requests", "Requests answered", ["route", "backend", "status"],
                                registry=self.registry)
        self.duration = Histogram("kvgate_request_duration_seconds", "Time to the end of the response", ["route"],
                                  registry=self.registry,
                                  buckets=(0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.prompt_tokens = Counter("kvgate_prompt_tokens", "Prompt tokens counted", ["backend", "counter", "exact"],
                                     registry=self.registry)
        self.tenant_requests = Counter("kvgate_tenant_requests", "Requests answered, by tenant", ["tenant", "status"],
                                       registry=self.registry)
        self.tenant_prompt_tokens = Counter("kvgate_tenant_prompt_tokens", "Prompt tokens kvgate forwarded, by tenant",
                                            ["tenant"], registry=self.registry)
        self.tenant_output_tokens = Counter("kvgate_tenant_output_tokens", "Output tokens the backend reported, by "
                                            "tenant", ["tenant"], registry=self.registry)
        self.tenant_refusals = Counter("kvgate_tenant_refusals", "Requests kvgate refused itself, by tenant",
                                       ["tenant", "reason"], registry=self.registry)
        self.tenant_queue_seconds = Counter("kvgate_tenant_queue_seconds", "Queue waits of admitted requests, by "
                                            "tenant", ["tenant"], registry=self.registry)
        self.tenant_usage = TenantUsage()
        self.decisions = Counter("kvgate_decisions", "What admission did", ["backend", "decision"],
                                 registry=self.registry)
        self.truncations = Counter("kvgate_truncations", "Replies whose reported prompt length is short of kvgate's "
                                   "count beyond its tolerance (the backend cut the prompt silently)",
                                   ["backend", "model"], registry=self.registry)
        self.truncation_log = TruncationLog()
        self.recent_decisions = DecisionLog()  # the status page's "recent decisions"
        self.outcomes = OutcomeTally()  # requests by outcome, per pool (the status page's counts since start)
        self.longest_prompts = LongestPrompts()  # per backend and model, for kvgate check --gateway
        self.config_reloads = Counter("kvgate_config_reloads", "Configuration reloads (SIGHUP, POST /kvgate/reload)",
                                      ["outcome"], registry=self.registry)
        for outcome in ("ok", "refused"):
            self.config_reloads.labels(outcome)  # both series from the start, at 0

    def record_reload(self, outcome: str) -> None:
        """Count one configuration reload: "ok" or "refused"."""
        self.config_reloads.labels(outcome).inc()

    def watch_pools(self, room: WaitingRoom, pools: Callable[[], dict[tuple[str, str], PoolSpec]]) -> None:
        self.registry.register(_PoolCollector(room, pools, self.outcomes))

    def watch_gpus(self, board: GpuBoard) -> None:
        self.registry.register(_GpuCollector(board))

    def watch_loads(self, counts: Callable[[], Mapping[str, LoadCounts]]) -> None:
        self.registry.register(_LoadCollector(counts))

    def watch_summaries(self, summaries: Summaries) -> None:
        self.registry.register(_SummaryCollector(summaries))

    def child(self, metric: Counter | Histogram, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: the lookup is on every request's path."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*_labels(labels))
        return found

    def count(self, metric: Counter, *labels: str, amount: float = 1.0) -> None:
        """``metric.labels(*labels).inc(amount)``, added up here until the registry is read (module docstring)."""
        if amount < 0:
            raise ValueError(f"a counter can't go down ({metric._name}: {amount})")
        child = self.child(metric, *labels)
        pending = self._pending
        pending[child] = pending.get(child, 0.0) + amount

    def flush(self) -> None:
        """Hand the counts added since the last read to prometheus-client."""
        pending, self._pending = self._pending, {}
        for child, amount in pending.items():
            child.inc(amount)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def record_truncation(metrics: Metrics, request_id: str, backend: str, model: str, found: Truncation) -> None:
    """Count one silent truncation (``model`` must be a bounded label: ``truncations.model_label``)."""
    metrics.child(metrics.truncations, backend, model).inc()
    metrics.truncation_log.add(request_id=request_id, backend=backend, model=model,
                               counted_tokens=found.counted_tokens, reported_tokens=found.reported_tokens,
                               counter=found.counter)


def record(metrics: Metrics, exchange: Exchange, elapsed_s: float) -> None:
    """Count one answered request, once, from its exchange: the backend's name ("-" when none was chosen), what
    admission did (no outcome: the request went through no admission), the output the backend reported, why kvgate
    refused it (``tenant_usage.refusal_reason``), the pool it was planned in, and the reason of a summary that
    failed before a refusal. Every count of decisions and refusals (these metrics, the status page's) comes from
    here (``observability/outcomes.py``)."""
    route, status, backend, tenant = exchange.facts.route_label, exchange.status, exchange.backend_name, \
        exchange.tenant_label
    outcome, refusal, pool = exchange.outcome, exchange.refusal, exchange.pool
    count = metrics.count
    count(metrics.requests, route, backend, str(status))
    count(metrics.tenant_requests, tenant, str(status))
    metrics.child(metrics.duration, route).observe(elapsed_s)
    _record_tenant(metrics, tenant, status, outcome, exchange.output_tokens, refusal)
    decisions = request_decisions(outcome, refusal, exchange.summary_failure, exchange.elastic_end is not None)
    metrics.outcomes.add(pool if pool is not None else outcome.reserved.pool if outcome and outcome.reserved
                         else None, decisions, refusal)
    for decision in decisions:
        count(metrics.decisions, backend, decision)
    if outcome is None:
        return
    forwarded = outcome.forwarded_count
    count(metrics.prompt_tokens, backend, forwarded.counter, "exact" if forwarded.exact else "estimate",
          amount=forwarded.tokens)


def _record_tenant(
    metrics: Metrics, tenant: str, status: int, outcome: AdmissionOutcome | None, output_tokens: int | None,
    refusal: str | None,
) -> None:
    """The ``kvgate_tenant_*`` usage counters and the same figures for ``/kvgate/tenants``."""
    if tenant == UNIDENTIFIED:
        return
    count = metrics.count
    prompt_tokens = outcome.forwarded_count.tokens if outcome is not None else 0
    queue_s = outcome.waited_s if outcome is not None else 0.0
    count(metrics.tenant_prompt_tokens, tenant, amount=prompt_tokens)
    count(metrics.tenant_queue_seconds, tenant, amount=queue_s)
    count(metrics.tenant_output_tokens, tenant, amount=output_tokens or 0)
    if refusal is not None:
        count(metrics.tenant_refusals, tenant, refusal)
    metrics.tenant_usage.add(tenant, status, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                             queue_s=queue_s, refusal=refusal)
