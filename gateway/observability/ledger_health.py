"""The shared ledger in metrics and on the status page: is Redis answering, and what the leases went through."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.admission.shared.shared_pools import SharedPools
from gateway.loads.shared_gpu import SharedGpu


class SharedLedgerCollector(Collector):
    def __init__(self, shared: SharedPools, gpu: SharedGpu | None = None) -> None:
        self._shared = shared
        self._gpu = gpu

    def collect(self) -> Iterator[Metric]:
        shared = self._shared
        yield GaugeMetricFamily("kvgate_shared_ledger_up", "1 while the shared ledger's Redis answers, else 0",
                                value=1 if shared.up else 0)
        for name, doc, value in (
            ("kvgate_shared_ledger_outages", "Times Redis stopped answering (on_unreachable applied)",
             shared.down_total),
            ("kvgate_shared_ledger_lost_races", "Admissions the reserve script turned down because another replica "
             "took the room first; they waited again", shared.lost_races_total),
            ("kvgate_shared_ledger_turns_kept", "Admissions the reserve script turned down to keep the fair order "
             "across replicas (a request ahead of it, waiting on any replica, takes the room first); they waited "
             "again", shared.turns_kept_total),
            ("kvgate_shared_ledger_wakeups", "Times a release on some replica woke this replica's waiters before "
             "their next poll", shared.wakeups_total),
            ("kvgate_shared_ledger_expired_leases", "Leases seen expired (a replica stopped renewing them)",
             shared.expired_total),
            ("kvgate_shared_ledger_readded_leases", "This replica's leases Redis no longer had (expired or lost) "
             "that were added back, capacity-checked", shared.readded_total),
            ("kvgate_shared_ledger_fenced", "Requests this replica ended because their leases could not be kept "
             "(not renewed in time, or no room to add them back)", shared.fences.fenced_total),
            ("kvgate_shared_ledger_gpu_lease_waits", "Load decisions (and unloads a client asked for) that waited "
             "for another replica's lease on the backend's GPU", 0 if self._gpu is None else self._gpu.waits_total),
        ):
            yield CounterMetricFamily(name, doc, value=value)


def shared_status(shared: SharedPools | None, gpu: SharedGpu | None = None) -> dict[str, Any]:
    """The ``shared_ledger`` part of ``/kvgate/status`` (never the Redis URL: it may hold a password)."""
    if shared is None:
        return {"enabled": False}
    config = shared.config
    return {
        "enabled": True, "up": shared.up, "down_reason": None if shared.up else shared.down_reason,
        "replica": shared.store.replica, "prefix": config.prefix, "lease_ttl_s": config.lease_ttl_s,
        "on_unreachable": config.on_unreachable, "outages": shared.down_total,
        "lost_races": shared.lost_races_total, "turns_kept": shared.turns_kept_total,
        "wakeups": shared.wakeups_total, "expired_leases": shared.expired_total,
        "fenced": shared.fences.fenced_total, "fence_margin_s": config.fence_margin_s,
        "gpu_lease_waits": 0 if gpu is None else gpu.waits_total,
    }
