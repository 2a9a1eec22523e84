"""The waiting room: the only asynchronous part of admission. It only waits; the planner decides.

Theory of operation
-------------------
Every request enters through ``acquire``. It joins its pool's queue, ordered by priority (higher first) then arrival,
and the room *dispatches* that queue: walking it in order, it asks ``plan`` about each waiter with a fresh ledger
snapshot, reserves for every Admit, fails every Reject, and leaves every Wait in place. A request that fits when it
arrives (and may pass whoever waits) is therefore admitted without yielding to the event loop. Dispatch runs again
whenever capacity comes back (``release``) or a waiter leaves, never on a timer.

    pool ('gpu0', 'm'), unified, 32,768 tokens:   | A 20,000 | B 9,000 | free 3,768 |
    queue (priority, then arrival):               [ C needs 8,000, waited 2 s ] [ D needs 1,000 ] [ E needs 500 ]
    dispatch:  C waits; D and E may pass C because C has waited less than overtake_window_s.
               Once C has waited longer, nobody passes it: released tokens accumulate until C fits.

Fair order between tenants. Within one priority the queue is not in arrival order but in weighted fair order of
reserved tokens (``fair_share``: each request is tagged on arrival with its tenant's virtual start time, and the
lowest tag goes first), so one tenant's flood of long requests queues behind itself while another tenant's request
waits only for capacity. ``Policy.fair_queueing = False`` (``admission.queue_order = "arrival"``) keeps arrival order.
Every admission, straight or after a wait, moves the pool's virtual time, so a tenant that used the pool while
nobody queued has its turn counted too. With a shared ledger (several replicas), a waiter's tag comes from the pool's
clock in Redis when it takes its place in the shared queue, so the order is one across replicas, and the reserve
script admits a request only when it is its turn there (``shared/scripts.py``). A waiter turned down is *held*: it
does not ask again until the pool's totals are read again (a release on any replica wakes the pool, else
``poll_s``), so a replica never spins on Redis.

Head-of-line policy. A waiter that does not fit must not block smaller ones forever, nor be starved by a stream of
them. So a request may overtake a waiter held back by the *pool* only while that waiter has waited less than
``policy.overtake_window_s`` (5 s by default); once it has waited longer, dispatch stops at it and the queue is strict
FIFO behind it until enough capacity has been released for it (0 s makes the whole queue strict FIFO). A waiter held
back by its *tenant's* cap never blocks others: that cap is about fairness between tenants, not capacity. Priorities
are strict: a steady stream of higher-priority work can delay lower priorities until their ``queue_timeout_s``;
that is what an operator asks for by setting them.

Guarantees:
- Between a snapshot and the matching ``reserve`` there is no ``await``, so the pool is never oversubscribed.
- A waiter leaves the queue exactly once: admitted, rejected, timed out (503 ``queue_timeout`` after
  ``queue_timeout_s``), its client gone (``is_disconnected`` polled while waiting, or its task cancelled), or refused
  because the queue already held ``max_queue`` (503 ``queue_full``). If it was admitted in the same instant its task
  was cancelled, its reservation is released on the spot.
- ``release`` frees through the ledger, exactly once, and then re-dispatches; ``acquire`` returns a ``Permit`` that
  makes "exactly once on completion, error or disconnect" the default.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.admission import rejections as errors
from gateway.admission.fair_share import FairClock, Tag
from gateway.admission.ledger import Ledger, Reservation
from gateway.admission.permit import Permit
from gateway.admission.planner import held_sequences, plan
from gateway.admission.queue_share import over_share
from gateway.admission.rejections import AdmissionRejected
from gateway.admission.shared.shared_pools import SharedPools
from gateway.admission.shared.snapshots import combine, limits_for
from gateway.admission.shared.store import Place, Turn
from gateway.admission.stats import QueueCounters, QueueStats, WaiterView
from gateway.admission.types import Admit, LedgerSnapshot, Policy, PoolKey, PoolSpec, Reject, RequestCost, Wait
from gateway.backends.model_names import name_candidates

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class _Grant:
    reservation: Reservation
    admit: Admit
    waited_s: float


@dataclass(eq=False, slots=True)
class _Waiter:
    seq: int
    key: PoolKey
    pool: PoolSpec
    cost: RequestCost
    policy: Policy
    enqueued_at_s: float
    future: asyncio.Future[_Grant]
    tag: Tag
    reason: str = "it has not been planned yet"
    queued: bool = False  # the first dispatch did not admit it, so it really waited
    placed: bool = False  # counted against max_queue (here, and across replicas when shared)
    joined: bool = False  # holds a place in the shared queue, to give back when it leaves
    held: bool = False  # the shared ledger said it is not its turn: wait for fresh totals before asking again
    arrival_ms: float = math.inf  # in the shared queue (Redis's clock); until it joined, after all who did

    @property
    def order(self) -> tuple[int, float, float, int]:
        """The reserve script's order too (``shared/scripts.py``: priority, start tag, arrival, sequence number), so
        the head of the shared queue is always the head of its own replica's queue."""
        fair_start = self.tag.start if self.policy.fair_queueing else 0.0
        return (-self.cost.priority, fair_start, self.arrival_ms, self.seq)


class WaitingRoom:
    """Queues per pool in front of one ``Ledger``; see the module docstring."""

    def __init__(self, ledger: Ledger, *, clock: Clock = time.monotonic, disconnect_poll_s: float = 0.25,
                 shared: SharedPools | None = None) -> None:
        self._ledger = ledger
        self._shared = shared
        self._clock = clock
        self._poll_s = disconnect_poll_s
        self._queues: dict[PoolKey, list[_Waiter]] = {}
        self._counters: dict[PoolKey, QueueCounters] = {}
        self._fair: dict[PoolKey, FairClock] = {}
        self._seq = itertools.count()
        self._growing: dict[int, asyncio.Task[None]] = {}
        """Growth steps on their way through the shared ledger, by reservation id (one at a time each)."""

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    def active_sequences(self, backend: str, model: str) -> int:
        """kvgate's sequences active on (backend, model): what the load level (loads/gate.py) reads of this one.
        With a shared ledger, every replica's: the others' as last read (``refresh_active`` reads them afresh)."""
        key = PoolKey(backend, model)
        mine = self._ledger.snapshot(key).active_sequences
        return mine if self._shared is None else mine + self._shared.others(key).active_sequences

    async def refresh_active(self, backend: str, models: Sequence[str]) -> None:
        """Read the other replicas' sequences on these models afresh (each spelling a pool may go by): before a load
        decision, so a model another replica runs requests on is never taken for idle. Nothing without a shared
        ledger."""
        if self._shared is not None:
            keys = dict.fromkeys(PoolKey(backend, name) for model in models for name in name_candidates(model))
            await self._shared.refresh(keys, touch=False)

    async def acquire(
        self,
        key: PoolKey | tuple[str, str],
        pool: PoolSpec,
        cost: RequestCost,
        policy: Policy,
        *,
        is_disconnected: Callable[[], bool] | None = None,
    ) -> Permit:
        """Wait until the request is admitted and reserved; raise ``AdmissionRejected`` when it never will be.

        The ``Permit`` returned (a context manager) releases the reservation exactly once."""
        grant = await self._admit(PoolKey(*key), pool, cost, policy, is_disconnected)
        return Permit(grant.reservation, grant.admit, grant.waited_s, self.release)

    def release(self, reservation: Reservation) -> bool:
        """Free the reservation (a no-op after the first call) and let waiters of its pool in."""
        freed = self._ledger.release(reservation)
        if freed:
            if self._shared is not None:
                self._shared.release(reservation)
            self.redispatch(reservation.key)
        return freed

    def grow(self, permit: Permit, tokens: int, pool: PoolSpec) -> bool:
        """An elastic reply's hold becomes ``tokens`` (``elastic``) when the pool's free cells allow it: True when
        it did. Growing never passes the pool (the watermark is the admissions', not growth's); a hold that shrinks
        lets waiters in."""
        reservation = permit.reservation
        if permit.released:
            return False
        snapshot = self.pool_snapshot(reservation.key)
        if tokens > reservation.tokens and snapshot.reserved_tokens + tokens - reservation.tokens > pool.pool_tokens:
            return False
        if self._shared is not None:  # final once Redis agrees, across replicas: until then the hold is as it was
            if reservation.id not in self._growing:
                self._growing[reservation.id] = asyncio.get_running_loop().create_task(
                    self._grow_shared(self._shared, permit, tokens, pool))
            return False
        return self._resize(permit, tokens)

    def _resize(self, permit: Permit, tokens: int) -> bool:
        reservation = permit.reservation
        resized = self._ledger.resize(reservation, tokens)
        if resized is None:
            return False
        permit.reservation = resized
        if self._shared is not None:
            self._shared.resized(reservation, resized)
        if tokens < reservation.tokens:
            self.redispatch(reservation.key)
        return True

    async def _grow_shared(self, shared: SharedPools, permit: Permit, tokens: int, pool: PoolSpec) -> None:
        """One growth step through the shared ledger's script; the reply's next chunk finds it taken."""
        reservation = permit.reservation
        try:
            if await shared.resize(reservation, tokens, pool.pool_tokens) and permit.reservation is reservation \
                    and not permit.released:
                self._resize(permit, tokens)
        finally:
            self._growing.pop(reservation.id, None)

    @property
    def shared(self) -> SharedPools | None:
        return self._shared

    def waiting_keys(self) -> tuple[PoolKey, ...]:
        """Pools with requests waiting (the shared ledger reads their totals across replicas while they do)."""
        return tuple(self._queues)

    def redispatch(self, key: PoolKey) -> None:
        """Capacity may have come back (here, or another replica released): let the pool's waiters in, those the
        shared ledger held back too."""
        for waiter in self._queues.get(key, ()):
            waiter.held = False
        self._dispatch(key)

    def _waiting_across(self, key: PoolKey) -> bool:
        return self._shared is not None and self._shared.waiting_across(key) > 0

    def pool_snapshot(self, key: PoolKey) -> LedgerSnapshot:
        """What the pool holds: this replica's reservations, plus (shared) what the other replicas hold."""
        here = self._ledger.snapshot(key)
        return here if self._shared is None else combine(here, self._shared.others(key))

    def queue_length(self, key: PoolKey | tuple[str, str]) -> int:
        """Requests waiting for the pool: here, or (shared) on every replica as Redis last announced."""
        here = len(self._queues.get(PoolKey(*key), ()))
        return here if self._shared is None else max(here, self._shared.waiting_across(PoolKey(*key)))

    def stats(self) -> dict[PoolKey, QueueStats]:
        """Per pool: who waits now and for how long, plus counters since start."""
        now_s = self._clock()
        return {
            key: QueueStats.of(key, tuple(self._view(w, now_s) for w in self._queues.get(key, ())), self._counter(key))
            for key in (*self._counters, *(k for k in self._queues if k not in self._counters))
        }

    # --- the queue --------------------------------------------------------------------------------------------------

    async def _admit(
        self,
        key: PoolKey,
        pool: PoolSpec,
        cost: RequestCost,
        policy: Policy,
        is_disconnected: Callable[[], bool] | None,
    ) -> _Grant:
        shared = self._shared
        if shared is None:
            return (await self._admit_here(key, pool, cost, policy, is_disconnected, None))[0]
        shared.refuse_if_down(key)
        shared.know(pool)
        again: _Waiter | Tag | None = None
        while True:  # admitted here, then committed across replicas; a lost race (or not its turn) waits again
            grant, again = await self._admit_here(key, pool, cost, policy, is_disconnected, again)
            if await self._commit(shared, grant, pool, cost, policy, again):
                return grant
            if isinstance(again, _Waiter):
                again.held = True

    async def _admit_here(
        self,
        key: PoolKey,
        pool: PoolSpec,
        cost: RequestCost,
        policy: Policy,
        is_disconnected: Callable[[], bool] | None,
        again: _Waiter | Tag | None,
    ) -> tuple[_Grant, _Waiter | Tag]:
        """Admit against this replica's view. ``again`` is a request whose admission another replica beat: a waiter
        goes back to its place in the queue (same arrival, same fair tag), one admitted at once (its fair tag) joins
        the queue now. The second value is what to pass as ``again`` if this admission loses too."""
        if isinstance(again, Tag):
            future: asyncio.Future[_Grant] = asyncio.get_running_loop().create_future()
            waiter = _Waiter(next(self._seq), key, pool, cost, policy, self._clock(), future, again, held=True)
        elif again is None:
            first = plan(cost, pool, self.pool_snapshot(key), policy)
            if isinstance(first, Reject):  # rejections never depend on the snapshot: refuse now, not after a wait
                self._counter(key).plan_rejections_total += 1
                raise AdmissionRejected(first)
            fair = self._fair.setdefault(key, FairClock())
            tag = fair.tag(cost.tenant, _reserve_tokens(first, cost, pool, policy), cost.weight)
            if isinstance(first, Admit) and key not in self._queues and not self._waiting_across(key):
                fair.served(tag)  # nobody waits, here or (shared) anywhere: dispatch would admit it at once
                return _Grant(self._reserve(key, first, cost.tenant), first, 0.0), tag
            future = asyncio.get_running_loop().create_future()
            waiter = _Waiter(next(self._seq), key, pool, cost, policy, self._clock(), future, tag)
        else:
            waiter = again
            waiter.future = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(key, [])
        bisect.insort(queue, waiter, key=lambda w: w.order)
        try:
            if self._shared is not None:  # its place in the shared queue before its first commit (one fair order)
                await self._take_place(waiter, queue)
        except BaseException:
            self._abandon(waiter)
            raise
        self._dispatch(key)
        if waiter.future.done():
            return waiter.future.result(), waiter
        waiter.queued = True
        try:
            await self._take_place(waiter, queue)
            return await self._wait(waiter, is_disconnected), waiter
        except asyncio.CancelledError:
            self._counter(key).left_total += 1
            self._abandon(waiter)
            raise
        except BaseException:
            self._abandon(waiter)
            raise

    async def _take_place(self, waiter: _Waiter, queue: list[_Waiter]) -> None:
        """A new waiter takes a place in the queue, here and (shared) across replicas, or is refused: queue full."""
        if waiter.placed:
            return
        waiter.placed = True
        key, policy = waiter.key, waiter.policy
        waiting = len(queue)
        if waiting <= policy.max_queue and self._shared is not None and not waiter.future.done():
            waiting = await self._join_shared(self._shared, waiter) or waiting
        if waiting > policy.max_queue and not waiter.future.done():
            self._counter(key).queue_full_total += 1
            raise AdmissionRejected(errors.queue_full(key, waiting - 1, policy.max_queue,  # those before it
                                                      waiter.cost.model))
        over = over_share(waiter.cost.tenant, (w.cost.tenant for w in queue if w.placed and w is not waiter), policy)
        if over is not None and not waiter.future.done():  # one tenant's flood leaves the others places
            self._counter(key).queue_full_total += 1
            raise AdmissionRejected(errors.tenant_queue_full(key, waiter.cost.tenant, over[0], over[2],
                                                             waiter.cost.model))

    async def _join_shared(self, shared: SharedPools, waiter: _Waiter) -> int | None:
        """Its place in the shared queue, and the fair tag from the pool's clock in Redis (the one order across
        replicas): how many wait there with it, or None when Redis is unreachable."""
        joined = await shared.join_queue(waiter.key, waiter.seq, waiter.policy.max_queue, _place(waiter))
        if joined is None:
            return None
        waiter.joined = joined.placed
        if joined.placed:
            waiter.tag = Tag(waiter.cost.tenant, joined.start, joined.finish)
            waiter.arrival_ms = joined.arrival_ms
            self._queues.get(waiter.key, []).sort(key=lambda w: w.order)
        return joined.waiting

    async def _commit(self, shared: SharedPools, grant: _Grant, pool: PoolSpec, cost: RequestCost, policy: Policy,
                      waiter: _Waiter | Tag) -> bool:
        """Make a grant final across replicas; a lost race (or not its turn yet) frees it here and answers False. A
        waiter without a place in the shared queue (Redis was away when it came) takes one first."""
        if isinstance(waiter, _Waiter) and not waiter.joined and shared.up:
            await self._join_shared(shared, waiter)
        reservation = grant.reservation
        place = waiter.seq if isinstance(waiter, _Waiter) and waiter.joined else None
        turn = Turn(None if place is None else str(place), policy.overtake_window_s, _fair_weight(cost, policy),
                    cost.priority)
        commit = asyncio.ensure_future(shared.commit(reservation, limits_for(pool, policy), turn,
                                                     queued=isinstance(waiter, _Waiter)))
        try:
            committed = await asyncio.shield(commit)
        except asyncio.CancelledError:  # the lease may land after this: free it once the commit is done
            commit.add_done_callback(lambda _: self.release(reservation))
            raise
        except BaseException:
            self.release(reservation)
            raise
        if not committed:
            self.release(reservation)
        return committed

    async def _wait(self, waiter: _Waiter, is_disconnected: Callable[[], bool] | None) -> _Grant:
        deadline_s = waiter.enqueued_at_s + waiter.policy.queue_timeout_s
        while not waiter.future.done():
            remaining_s = deadline_s - self._clock()
            if remaining_s <= 0:
                self._counter(waiter.key).timed_out_total += 1
                waited_s = self._clock() - waiter.enqueued_at_s
                timeout_s = waiter.policy.queue_timeout_s
                raise AdmissionRejected(errors.queue_timeout(waiter.key, waited_s, timeout_s, waiter.reason,
                                                             waiter.policy.queue_limit_name, waiter.cost.model))
            step_s = remaining_s if is_disconnected is None else min(remaining_s, self._poll_s)
            await asyncio.wait((waiter.future,), timeout=step_s)
            if not waiter.future.done() and is_disconnected is not None and is_disconnected():
                self._counter(waiter.key).left_total += 1
                raise AdmissionRejected(errors.client_closed(waiter.key, self._clock() - waiter.enqueued_at_s,
                                                             waiter.cost.model))
        return waiter.future.result()

    def _abandon(self, waiter: _Waiter) -> None:
        """The awaiting task is leaving (timeout, disconnect, cancellation): leave no waiter and no reservation."""
        future = waiter.future
        if waiter.joined and self._shared is not None:
            self._shared.leave_queue(waiter.key, waiter.seq)
        if not future.done():
            self._remove(waiter)
        elif not future.cancelled() and future.exception() is None:
            self.release(future.result().reservation)  # admitted in the same instant its task was cancelled

    def _remove(self, waiter: _Waiter) -> bool:
        queue = self._queues.get(waiter.key, [])
        try:
            queue.remove(waiter)
        except ValueError:
            return False
        self._fair[waiter.key].withdrawn(waiter.tag)
        if not queue:
            del self._queues[waiter.key]
        self._dispatch(waiter.key)  # it may have been the head that held the others back
        return True

    def _dispatch(self, key: PoolKey) -> None:
        """Walk the queue in order, admitting whoever fits and may pass; see the head-of-line policy above."""
        queue = self._queues.get(key)
        if not queue:
            return
        now_s = self._clock()
        for waiter in tuple(queue):
            if waiter.held:
                waiter.reason = _NOT_ITS_TURN
                continue
            decision = plan(waiter.cost, waiter.pool, self.pool_snapshot(key), waiter.policy)
            if isinstance(decision, Wait):
                waiter.reason = decision.reason
                if decision.scope == "pool" and now_s - waiter.enqueued_at_s >= waiter.policy.overtake_window_s:
                    break  # it has waited long enough: keep every freed token for it
                continue
            queue.remove(waiter)
            if isinstance(decision, Reject):
                self._fair[key].withdrawn(waiter.tag)
                self._counter(key).plan_rejections_total += 1
                waiter.future.set_exception(AdmissionRejected(decision))
            else:
                waiter.future.set_result(self._grant(waiter, decision, now_s))
        if not queue:
            del self._queues[key]

    def _grant(self, waiter: _Waiter, admit: Admit, now_s: float) -> _Grant:
        self._fair[waiter.key].served(waiter.tag)
        reservation = self._reserve(waiter.key, admit, waiter.cost.tenant)
        waited_s = 0.0
        if waiter.queued:
            waited_s = now_s - waiter.enqueued_at_s
            self._counter(waiter.key).count_wait(waited_s)
            admit = dataclasses.replace(admit, notes=(*admit.notes, f"waited {waited_s:.2f} s in the queue"))
        return _Grant(reservation, admit, waited_s)

    def _reserve(self, key: PoolKey, admit: Admit, tenant: str) -> Reservation:
        self._counter(key).admitted_total += 1
        return self._ledger.reserve(key, admit.reserve_tokens, tenant, admit.sequences)

    def _counter(self, key: PoolKey) -> QueueCounters:
        counters = self._counters.get(key)
        if counters is None:
            counters = self._counters[key] = QueueCounters()
        return counters

    def _view(self, waiter: _Waiter, now_s: float) -> WaiterView:
        return WaiterView(waiter.cost.tenant, waiter.cost.priority, now_s - waiter.enqueued_at_s, waiter.reason)


_NOT_ITS_TURN = ("requests ahead of it in the fair order, waiting on other replicas of kvgate, take the freed room "
                 "first")


def _place(waiter: _Waiter) -> Place:
    """What the shared queue keeps of a waiter: what it will reserve, what orders it, and its tenant's caps."""
    limits = limits_for(waiter.pool, waiter.policy)
    return Place(_reserve_tokens(Wait(""), waiter.cost, waiter.pool, waiter.policy),
                 held_sequences(waiter.cost, waiter.pool),  # n per prompt, for the prompts that run at once
                 waiter.cost.tenant, _fair_weight(waiter.cost, waiter.policy), waiter.cost.priority,
                 limits.tenant_max_active, limits.tenant_share_tokens)


def _fair_weight(cost: RequestCost, policy: Policy) -> float:
    """The weight the shared queue orders by: 0 keeps arrival order (``admission.queue_order = "arrival"``)."""
    return cost.weight if policy.fair_queueing else 0.0


def _reserve_tokens(first: Admit | Wait, cost: RequestCost, pool: PoolSpec, policy: Policy) -> int:
    """What the request will reserve, known before it fits: its plan against an empty pool (rejections never depend
    on the snapshot, so a request that was not rejected is admitted there)."""
    if isinstance(first, Admit):
        return first.reserve_tokens
    empty = plan(cost, pool, LedgerSnapshot(), policy)
    return empty.reserve_tokens if isinstance(empty, Admit) else cost.prompt_tokens
