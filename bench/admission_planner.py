"""Part 1 of ``bench.admission``: how long one admission decision takes with 1,000 active reservations.

Pure and synchronous (no sockets): the ledger holds 1,000 live reservations across eight realistic pools, and each
timed call is exactly what the waiting room does for a request that arrives: ``plan(cost, pool,
ledger.snapshot(key), policy)``. The requests cycle through every outcome (Admit on pools with room, Wait on the two
pools filled for the purpose and on a tenant's cap, Reject for prompts longer than the context), on split and unified
pools.

    split   4 Ollama models, OLLAMA_NUM_PARALLEL=128 x num_ctx 8,192: 125 active sequences each (500)
    unified 4 llama-server pools of 1,048,576 cells, 128 slots: 125 active sequences each (500), 2K-6K tokens each

Two more rows, for context (no target): the waiting room's fast path (``acquire`` with nobody queued, which plans,
reserves and returns a permit, then ``release``, which frees and dispatches an empty queue), and a release that
dispatches a queue of 64 waiters on a full pool (one admitted, 63 planned again and left waiting).

Every sample is one call timed alone with ``time.perf_counter_ns`` (its own overhead, about 50 ns, included);
the table gives median, p90 and p99 in microseconds. Target: median decision at most 50 µs.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from gateway.admission.ledger import Ledger, Reservation
from gateway.admission.permit import Permit
from gateway.admission.planner import plan
from gateway.admission.types import Decision, Policy, PoolSpec, RequestCost, Wait
from gateway.admission.waiting_room import WaitingRoom
from gateway.domain import BackendKind

ACTIVE = 1000
TARGET_MEDIAN_US = 50.0
QUEUE = 64
TENANTS = tuple(f"team-{i}" for i in range(10))


@dataclass(frozen=True)
class Timing:
    """Samples of one timed call, in nanoseconds; outcome counts say which decisions were timed."""

    name: str
    samples_ns: list[int]
    outcomes: dict[str, int]

    def percentile_us(self, q: float) -> float:
        ordered = sorted(self.samples_ns)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1000

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_ns) / 1000

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "n": len(self.samples_ns), "median_us": round(self.median_us, 3),
                "p90_us": round(self.percentile_us(0.90), 3), "p99_us": round(self.percentile_us(0.99), 3),
                "outcomes": self.outcomes}


@dataclass(frozen=True)
class Scene:
    ledger: Ledger
    pools: list[PoolSpec]
    policies: dict[str, Policy]  # by pool model name


def pools() -> list[PoolSpec]:
    split = [PoolSpec.split_pool("ollama", f"model-{i}:8b", BackendKind.OLLAMA, slot_ctx_tokens=8192, slots=128)
             for i in range(4)]
    unified = [PoolSpec.unified_pool(f"cpp-{i}", "", pool_tokens=1 << 20, slots=128, slot_ctx_tokens=32768)
               for i in range(4)]
    return split + unified


def build_scene(seed: int = 1) -> Scene:
    """1,000 live reservations: 125 per pool, ten tenants round-robin (five hold 13 sequences per pool, five 12);
    two pools cap each tenant at 13, so requests of the first five wait there (scope "tenant")."""
    rng = random.Random(seed)
    ledger = Ledger()
    specs = pools()
    policies: dict[str, Policy] = {}
    for index, pool in enumerate(specs):
        policies[pool.backend + pool.model] = Policy(per_tenant_max_active=13 if index % 4 == 3 else None)
        for n in range(ACTIVE // len(specs)):
            tokens = rng.randint(2048, 6144) if pool.unified else rng.randint(600, 8192)
            ledger.reserve(pool.key, tokens, TENANTS[n % len(TENANTS)])
    ledger.check_invariants()
    return Scene(ledger, specs, policies)


def request_mix(count: int, seed: int = 2) -> list[RequestCost]:
    """Chats as clients send them: counted or estimated prompts, a limit or none, Ollama num_ctx now and then,
    a few prompts too long for any context (rejected), a few asking for n=2."""
    rng = random.Random(seed)
    costs = []
    for _ in range(count):
        roll = rng.random()
        prompt = rng.randint(20_000, 40_000) if roll < 0.05 else rng.randint(50, 4000)
        costs.append(RequestCost(
            prompt_tokens=prompt,
            prompt_exact=rng.random() < 0.8,
            max_output_tokens=rng.choice((None, 256, 1024, 4096, 16384)),
            requested_num_ctx=rng.choice((None, None, 4096, 8192, 16384)),
            tenant=rng.choice(TENANTS),
            sequences=2 if rng.random() < 0.05 else 1,
        ))
    return costs


def _outcome(decision: Decision) -> str:
    if isinstance(decision, Wait):
        return f"wait ({decision.scope})"
    return type(decision).__name__.lower()


def time_plan(scene: Scene, repetitions: int, kind: str | None = None) -> Timing:
    """``plan`` with a fresh snapshot, as the waiting room calls it; ``kind`` 'split'/'unified' picks pools."""
    chosen = [p for p in scene.pools if kind is None or p.unified == (kind == "unified")]
    costs = request_mix(min(repetitions, 4096))
    outcomes: dict[str, int] = {}
    samples = [0] * repetitions
    ledger, clock = scene.ledger, time.perf_counter_ns
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for i in range(repetitions):
            pool = chosen[i % len(chosen)]
            cost = costs[i % len(costs)]
            policy = scene.policies[pool.backend + pool.model]
            start = clock()
            decision = plan(cost, pool, ledger.snapshot(pool.key), policy)
            samples[i] = clock() - start
            name = _outcome(decision)
            outcomes[name] = outcomes.get(name, 0) + 1
    finally:
        if gc_was_on:
            gc.enable()
    label = "plan(), all 8 pools" if kind is None else f"plan(), {kind} pools"
    return Timing(label, samples, outcomes)


def _fill(scene: Scene) -> list[Reservation]:
    """Take the rest of one split and one unified pool, so that requests there wait."""
    held = []
    split, unified = scene.pools[0], scene.pools[4]
    for _ in range(split.slots - scene.ledger.snapshot(split.key).active_sequences):
        held.append(scene.ledger.reserve(split.key, 4096, "filler"))
    free = unified.pool_tokens - scene.ledger.snapshot(unified.key).reserved_tokens
    held.append(scene.ledger.reserve(unified.key, free, "filler"))
    return held


def _finish(coro: Coroutine[Any, Any, Permit]) -> Permit:
    """Run a coroutine that never suspends (the waiting room's fast path) to its result, without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        permit: Permit = done.value
        return permit
    coro.close()
    raise RuntimeError("acquire waited: the fast path was expected")


def time_room_fast_path(scene: Scene, repetitions: int) -> Timing:
    """``acquire`` (nobody queued: plan, reserve, permit) then ``release`` (free, dispatch an empty queue)."""
    room = WaitingRoom(scene.ledger)
    pool = scene.pools[5]  # unified, with room
    policy = scene.policies[pool.backend + pool.model]
    cost = RequestCost(1200, True, 512, None, tenant="team-1")
    samples = [0] * repetitions
    clock = time.perf_counter_ns
    for i in range(repetitions):
        start = clock()
        permit = _finish(room.acquire(pool.key, pool, cost, policy))
        room.release(permit.reservation)
        samples[i] = clock() - start
    return Timing("room: acquire + release", samples, {"admit": repetitions})


async def _time_dispatch(scene: Scene, repetitions: int) -> Timing:
    room = WaitingRoom(scene.ledger)
    pool = scene.pools[1]  # split, 125 of 128 slots taken
    policy = Policy(overtake_window_s=3600.0, max_queue=1024)  # every waiter is planned on each dispatch
    cost = RequestCost(900, True, 256, None, tenant="team-2")
    held = [scene.ledger.reserve(pool.key, 1156, "filler") for _ in range(pool.slots - 125)]
    tasks: list[asyncio.Task[Permit]] = []

    def enqueue() -> None:
        tasks.append(asyncio.ensure_future(room.acquire(pool.key, pool, cost, policy)))

    for _ in range(QUEUE):
        enqueue()
    await asyncio.sleep(0)
    assert room.queue_length(pool.key) == QUEUE, room.queue_length(pool.key)
    samples = [0] * repetitions
    clock = time.perf_counter_ns
    for i in range(repetitions):
        start = clock()
        room.release(held.pop())  # admits the head, plans the other 63 again
        samples[i] = clock() - start
        await asyncio.sleep(0)
        done = [task for task in tasks if task.done()]
        tasks[:] = [task for task in tasks if not task.done()]
        held.extend(task.result().reservation for task in done)
        enqueue()
        await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for reservation in held:
        room.release(reservation)
    return Timing(f"room: release, {QUEUE} queued", samples, {"admit": repetitions, "wait": repetitions * (QUEUE - 1)})


def run_planner(repetitions: int = 100_000, room_repetitions: int = 20_000) -> list[Timing]:
    """All rows of part 1, on one scene of 1,000 active reservations (two of its pools full)."""
    scene = build_scene()
    held = _fill(scene)
    rows = [time_plan(scene, repetitions), time_plan(scene, repetitions // 2, "split"),
            time_plan(scene, repetitions // 2, "unified")]
    for reservation in held:
        scene.ledger.release(reservation)
    assert sum(scene.ledger.snapshot(p.key).active_sequences for p in scene.pools) == ACTIVE
    rows.append(time_room_fast_path(scene, room_repetitions))
    rows.append(asyncio.run(_time_dispatch(scene, max(1, room_repetitions // 20))))
    scene.ledger.check_invariants()
    return rows


def render_planner(rows: list[Timing]) -> str:
    head = f"{'call':<30} {'n':>8} {'median us':>10} {'p90 us':>8} {'p99 us':>8}  outcomes"
    lines = [f"part 1: admission decisions with {ACTIVE:,} active reservations (4 split + 4 unified pools)",
             head, "-" * len(head)]
    for row in rows:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(row.outcomes.items()))
        lines.append(f"{row.name:<30} {len(row.samples_ns):>8} {row.median_us:>10.2f} {row.percentile_us(0.9):>8.2f} "
                     f"{row.percentile_us(0.99):>8.2f}  {outcomes}")
    median = rows[0].median_us
    verdict = "PASS" if median <= TARGET_MEDIAN_US else "FAIL"
    lines.append(f"target: median plan() decision <= {TARGET_MEDIAN_US:.0f} us: {median:.2f} us -> {verdict}")
    return "\n".join(lines)

