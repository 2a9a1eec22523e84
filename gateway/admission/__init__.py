"""Sequence-level admission: does this request's KV fit its model's pool now, later or never?

plan(cost, pool, snapshot, policy) -> Admit | Wait | Reject      pure (planner.py)
Ledger: reserve / release / snapshot per (backend, model)        bookkeeping (ledger.py)
WaitingRoom: admit / acquire / release / stats                   the only async part (waiting_room.py)

Around them: the admitter (admit.py: plan, fit, reserve or wait; one AdmissionOutcome, outcome.py), the pool
directory (pools.py, pool_slots.py), tenants, keyless caps, rates and charging, fair and queue shares, the shared
ledger across replicas (shared/). The load level (whether a model may load on the GPU at all) is ``gateway.loads``;
the dependency goes one way: the admitter and the pool directory call the load gate, which reads this level only
through ``WaitingRoom.active_sequences``.
"""

from typing import TYPE_CHECKING

from gateway.support.lazy import export

if TYPE_CHECKING:  # at run time each name is imported on first use (gateway/support/lazy.py)
    from gateway.admission.ledger import Ledger, Reservation
    from gateway.admission.permit import Permit
    from gateway.admission.planner import plan, reserved_prompt_tokens
    from gateway.admission.rejections import AdmissionRejected
    from gateway.admission.stats import QueueStats, WaiterView
    from gateway.admission.types import (
        Admit,
        Decision,
        LedgerSnapshot,
        Policy,
        PoolKey,
        PoolSpec,
        Reject,
        RequestCost,
        Wait,
    )
    from gateway.admission.waiting_room import WaitingRoom
    from gateway.domain import Rewrites

_EXPORTS = {
    "AdmissionRejected": "gateway.admission.rejections",
    "Admit": "gateway.admission.types",
    "Decision": "gateway.admission.types",
    "Ledger": "gateway.admission.ledger",
    "LedgerSnapshot": "gateway.admission.types",
    "Permit": "gateway.admission.permit",
    "Policy": "gateway.admission.types",
    "PoolKey": "gateway.admission.types",
    "PoolSpec": "gateway.admission.types",
    "QueueStats": "gateway.admission.stats",
    "Reject": "gateway.admission.types",
    "RequestCost": "gateway.admission.types",
    "Reservation": "gateway.admission.ledger",
    "Rewrites": "gateway.domain",  # the planner's rewrites, which fitting applies: kept below both
    "Wait": "gateway.admission.types",
    "WaiterView": "gateway.admission.stats",
    "WaitingRoom": "gateway.admission.waiting_room",
    "plan": "gateway.admission.planner",
    "reserved_prompt_tokens": "gateway.admission.planner",
}


def __getattr__(name: str) -> object:
    return export(__name__, _EXPORTS, name)


__all__ = [
    "AdmissionRejected",
    "Admit",
    "Decision",
    "Ledger",
    "LedgerSnapshot",
    "Permit",
    "Policy",
    "PoolKey",
    "PoolSpec",
    "QueueStats",
    "Reject",
    "RequestCost",
    "Reservation",
    "Rewrites",
    "Wait",
    "WaiterView",
    "WaitingRoom",
    "plan",
    "reserved_prompt_tokens",
]
