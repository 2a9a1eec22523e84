"""Tenants sharing one KV pool through kvgate's real waiting room, on virtual time: who is served, and who waits.

The waiting room (``gateway.admission.WaitingRoom``, its planner and ledger, unchanged) runs on a virtual clock, so a
scenario of minutes runs in a fraction of a second and gives the same numbers on every machine. Each request
reserves ``tokens`` (prompt + output) of a unified pool and holds them for ``hold_s`` virtual seconds once admitted
(a long answer holds its tokens longer). A stream of requests is either

    open     ``count`` requests arriving every ``every_s`` from ``start_s`` (a steady trickle, a flood at once), or
    closed   ``clients`` clients each sending its next request when its last one ends, ``count`` in all
             (a tenant that always has work queued: backlogged).

Reported per tenant: requests and tokens served inside the *contended window* (from the first arrival until the
first tenant has its last request admitted: the stretch in which every tenant still has work to be served), the
median and p90 wait, and the tenant's share of the tokens served in the window against its *fair share*: the
max-min weighted share, i.e. the weighted share of the served tokens, except that a tenant that asks for less gets
all it asks and the rest is split among the others by weight.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.admission import Ledger, Permit, Policy, PoolSpec, RequestCost, WaitingRoom

POOL = PoolSpec.unified_pool("gpu0", "llama3.1:8b", pool_tokens=32_768, slots=16)
FLOOD_HOLD_S = 8.0  # how long one flood request holds its 8,000 tokens


@dataclass(frozen=True)
class Stream:
    tenant: str
    weight: float
    tokens: int  # reserved per request: prompt + output
    hold_s: float  # how long an admitted request holds its tokens
    count: int
    start_s: float = 0.0
    every_s: float = 0.0  # open streams: the gap between arrivals (0: all at once)
    clients: int = 0  # closed streams: this many clients, each sending its next request when its last one ends
    output_tokens: int = 0  # of ``tokens``, the output part (the rest is prompt)


@dataclass
class TenantResult:
    tenant: str
    weight: float
    waits_s: list[float] = field(default_factory=list)
    served_tokens: int = 0  # admitted inside the contended window
    asked_tokens: int = 0  # arrived inside the contended window
    fair_tokens: float = 0.0

    @property
    def median_wait_s(self) -> float:
        return statistics.median(self.waits_s) if self.waits_s else 0.0

    @property
    def p90_wait_s(self) -> float:
        if len(self.waits_s) < 2:
            return self.median_wait_s
        return statistics.quantiles(self.waits_s, n=10)[-1]


@dataclass
class Result:
    order: str
    window_s: float
    tenants: dict[str, TenantResult]

    @property
    def served_tokens(self) -> int:
        return sum(t.served_tokens for t in self.tenants.values())

    def share(self, tenant: str) -> float:
        return self.tenants[tenant].served_tokens / max(self.served_tokens, 1)

    def fair_share(self, tenant: str) -> float:
        return self.tenants[tenant].fair_tokens / max(self.served_tokens, 1)


def flood(count: int) -> list[Stream]:
    """One tenant sending ``count`` long requests at once: 8,000 tokens held 8 s each."""
    return [Stream("flood", 1, 8000, FLOOD_HOLD_S, count)] if count else []


def trickle() -> list[Stream]:
    """Two tenants sending steadily, below their shares, for 2 minutes (less than even a 50-request flood lasts): a
    2,000-token request every 4 s, and b 4,000 (weight 2)."""
    return [Stream("a", 1, 2000, 2.0, 30, start_s=0.5, every_s=4.0),
            Stream("b", 2, 4000, 4.0, 30, start_s=0.7, every_s=4.0)]


def backlogged() -> list[Stream]:
    """Two tenants that always have work queued (16 clients each, back to back)."""
    return [Stream("a", 1, 2000, 2.0, 300, clients=16), Stream("b", 2, 2000, 2.0, 600, clients=16)]


def mixed() -> list[Stream]:
    """One trickle below its share and one backlogged tenant."""
    return [Stream("a", 1, 1000, 1.0, 100, start_s=0.5, every_s=1.0), Stream("b", 2, 3000, 3.0, 400, clients=16)]


SCENARIOS: dict[str, Callable[[], list[Stream]]] = {"trickle": trickle, "backlogged": backlogged, "mixed": mixed}
"""What the others send while ``flood(200)`` floods the pool (tests/admission/test_fair_queue.py, bench/fairness.py)."""


def max_min_fair(asked: dict[str, float], weights: dict[str, float], capacity: float) -> dict[str, float]:
    """Weighted max-min fair split of ``capacity``: nobody gets more than it asked; the rest goes by weight."""
    fair = {t: 0.0 for t in asked}
    left = dict(asked)
    while left and capacity > 1e-9:
        total_weight = sum(weights[t] for t in left)
        offer = {t: capacity * weights[t] / total_weight for t in left}
        settled = {t for t in left if left[t] <= offer[t]}
        if not settled:
            for t in left:
                fair[t] += offer[t]
            break
        for t in settled:
            fair[t] += left[t]
            capacity -= left.pop(t)
    return fair


@dataclass(order=True)
class _Event:
    at_s: float
    seq: int
    action: Callable[[], None] = field(compare=False)


async def simulate(streams: list[Stream], *, order: str = "fair", pool: PoolSpec = POOL,
                   overtake_window_s: float = 5.0, priorities: dict[str, int] | None = None) -> Result:
    """Run the streams through a real ``WaitingRoom`` on virtual time; see the module docstring."""
    now = [0.0]
    room = WaitingRoom(Ledger(), clock=lambda: now[0])
    policy = Policy(queue_timeout_s=1e9, max_queue=100_000, overtake_window_s=overtake_window_s,
                    fair_queueing=order == "fair")
    events: list[_Event] = []
    seq = itertools.count()
    results = {s.tenant: TenantResult(s.tenant, s.weight) for s in streams}
    arrivals: list[tuple[str, float, int]] = []  # tenant, arrived at, tokens
    admissions: list[tuple[str, float, int]] = []
    sent = {s.tenant: 0 for s in streams}

    def at(time_s: float, action: Callable[[], None]) -> None:
        heapq.heappush(events, _Event(time_s, next(seq), action))

    def send(stream: Stream) -> None:
        if sent[stream.tenant] >= stream.count:
            return
        sent[stream.tenant] += 1
        arrived_s = now[0]
        arrivals.append((stream.tenant, arrived_s, stream.tokens))
        output = stream.output_tokens or stream.tokens // 4
        priority = (priorities or {}).get(stream.tenant, 0)
        cost = RequestCost(stream.tokens - output, True, output, None, stream.tenant, priority, weight=stream.weight)
        task = asyncio.create_task(room.acquire(pool.key, pool, cost, policy))
        task.add_done_callback(lambda t: admitted(stream, arrived_s, t))

    def admitted(stream: Stream, arrived_s: float, task: asyncio.Task[Permit]) -> None:
        permit = task.result()
        results[stream.tenant].waits_s.append(now[0] - arrived_s)
        admissions.append((stream.tenant, now[0], stream.tokens))

        def done() -> None:
            permit.release()
            if stream.clients:
                send(stream)

        at(now[0] + stream.hold_s, done)

    for stream in streams:
        if stream.clients:
            for _ in range(min(stream.clients, stream.count)):
                at(stream.start_s, lambda stream=stream: send(stream))  # type: ignore[misc]
        else:
            for i in range(stream.count):
                at(stream.start_s + i * stream.every_s, lambda stream=stream: send(stream))  # type: ignore[misc]
    while events:
        event = heapq.heappop(events)
        now[0] = event.at_s
        event.action()
        for _ in range(8):  # let every woken waiter take its grant before the clock moves
            await asyncio.sleep(0)
    return summarise(order, results, arrivals, admissions)


def summarise(order: str, results: dict[str, TenantResult], arrivals: list[tuple[str, float, int]],
              admissions: list[tuple[str, float, int]]) -> Result:
    """Tokens served and asked inside the contended window (the first arrival until the first tenant has its last
    request admitted), and each tenant's max-min fair share of them; ``arrivals`` and ``admissions`` are
    ``(tenant, time_s, tokens)``, ``results`` carry each tenant's weight and waits."""
    start_s = min(time_s for _, time_s, _ in arrivals)
    end_s = min(max(t for tenant, t, _ in admissions if tenant == name) for name in results)
    for tenant, time_s, tokens in admissions:
        if start_s <= time_s <= end_s:
            results[tenant].served_tokens += tokens
    for tenant, time_s, tokens in arrivals:
        if start_s <= time_s < end_s:
            results[tenant].asked_tokens += tokens
    capacity = sum(r.served_tokens for r in results.values())
    fair = max_min_fair({t: float(r.asked_tokens) for t, r in results.items()},
                        {t: r.weight for t, r in results.items()}, capacity)
    for tenant, fair_tokens in fair.items():
        results[tenant].fair_tokens = fair_tokens
    return Result(order, end_s - start_s, results)


def render(title: str, result: Result) -> str:
    lines = [f"{title} (order: {result.order}; contended window {result.window_s:.0f} s)",
             f"  {'tenant':<8} {'weight':>6} {'served tokens':>14} {'share':>7} {'fair share':>10} "
             f"{'median wait':>12} {'p90 wait':>9}"]
    for name, t in result.tenants.items():
        lines.append(f"  {name:<8} {t.weight:>6g} {t.served_tokens:>14,} {result.share(name):>7.1%} "
                     f"{result.fair_share(name):>10.1%} {t.median_wait_s:>10.2f} s {t.p90_wait_s:>7.2f} s")
    return "\n".join(lines)


def run(streams: list[Stream], order: str = "fair", **kwargs: float) -> Result:
    return asyncio.run(simulate(streams, order=order, **kwargs))  # type: ignore[arg-type]
