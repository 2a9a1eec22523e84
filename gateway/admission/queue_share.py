"""One tenant's share of a pool's queue places (pure).

    max_queue 256, max_queue_share 0.5     | tenant a: at most 128 waiting | the others: the 128 a can't take |
    tenants.ci.max_queued = 10             | tenant ci: at most 10 waiting, whatever the share |

A tenant's flood of requests then fills its own share and gets 503 ``queue_full`` naming it, while another tenant
still finds places. The share is counted per pool, on this replica (with a shared ledger, ``max_queue`` itself is
counted across replicas; a tenant's share is each replica's own). Every keyless request is the one tenant
``anonymous``, so keyless clients together hold one share.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gateway.admission.types import Policy


def tenant_queue_places(policy: Policy) -> tuple[int, str]:
    """How many places one tenant may hold in a pool's queue, and the setting that says so."""
    if policy.tenant_max_queued is not None:
        return min(policy.tenant_max_queued, policy.max_queue), f"its max_queued of {policy.tenant_max_queued:,}"
    places = math.ceil(policy.max_queue * policy.max_queue_share - 1e-9)
    return places, (f"its {places:,} places (admission.max_queue_share {policy.max_queue_share:g} of max_queue "
                    f"{policy.max_queue:,})")


def over_share(tenant: str, waiting_tenants: Iterable[str], policy: Policy) -> tuple[int, int, str] | None:
    """None when ``tenant`` may take one more place (``waiting_tenants``: the tenants of those already waiting, it
    not among them); else how many of its requests wait, its places and the setting."""
    places, setting = tenant_queue_places(policy)
    held = sum(1 for name in waiting_tenants if name == tenant)
    return None if held < places else (held, places, setting)
