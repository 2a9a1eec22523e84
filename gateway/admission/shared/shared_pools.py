"""This replica's part in the shared ledger: its commits, its leases, and its view of the other replicas.

Theory of operation
-------------------
Every replica keeps its own waiting room and in-process ``Ledger`` (its own reservations), and plans exactly as a
single kvgate does, against a snapshot that adds what the *other* replicas hold (``others``):

    planning snapshot  =  this replica's ledger  +  others(key)
    others(key)        =  the pool's totals in Redis (every replica's leases)  -  this replica's committed leases

``others`` is as fresh as this replica's last call on the pool: every script's answer brings the pool's totals, the
renewal every third of ``lease_ttl_s`` reads every known pool's, and while requests wait the scripts announce every
change of their pool (with its totals and how many wait; this replica listens on its own connection) and the
pools' totals are read every ``poll_s`` too. While nobody waits, nothing is announced (``scripts``). A stale view is
never unsafe, because an admission is only final once ``commit`` has added the lease in Redis, where the reserve
script checks the planner's capacity rules again, atomically, against every replica's leases, and the fair order
across replicas (the pool's virtual time and tenants' tags live in Redis, and a waiter's place carries its tag). A
request that lost that race (another replica took the room first) or whose turn it is not (``behind``: a request
ahead of it in the fair order, waiting on any replica, fits first) goes back to its place in the queue and waits like
any other.

Leases. Each reservation is a lease with an expiry on Redis's clock. The replica renews all of its live leases every
third of ``lease_ttl_s``, so a replica that dies (SIGKILL, a crashed host, a partition) stops renewing and its
leases expire within ``lease_ttl_s``: the pool is whole again without anyone cleaning up. A release removes the
lease at once (and is safe to lose: the lease expires anyway). A renewal only extends leases Redis still has; one
that expired or was lost (Redis restarted empty), or was admitted while Redis was away, comes back only through the
capacity-checked reserve script, or its request is fenced. A release rides with this replica's next reserve of
the same pool (one Redis call for both) if one comes within ``RELEASE_RIDE_S``; it goes on its own after that, or at
once when requests wait for the pool on any replica (as last announced). Fencing (``fence.py``, ``fencing.py``):
a lease that can't be renewed has its request ended ``fence_margin_s`` before it may expire.

Redis unreachable. Said loudly (an ERROR line when it goes, a WARNING when it is back, ``kvgate_shared_ledger_up``
and the status page), then ``on_unreachable``:
    refuse        new requests get 503 ``ledger_unavailable`` with Retry-After; those admitted run to the end.
    local_share   until the others' leases may have ended (``lease_ttl_s`` after Redis went away), ``others`` is
                  what they were last known to hold plus all but 1/replicas of the room free then
                  (``known_share_others``; for a pool this replica never read, the whole pool); afterwards a
                  synthetic holder of all but 1/replicas of the pool (``local_share_others``), so N replicas
                  together stay within the pool. Once Redis answers again,
                  this replica's leases are added back (capacity-checked) and shared planning resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from gateway.admission import rejections as errors
from gateway.admission.ledger import Reservation
from gateway.admission.rejections import AdmissionRejected
from gateway.admission.shared.fencing import Fences
from gateway.admission.shared.snapshots import combine, freed, known_share_others, local_share_others, whole_pool
from gateway.admission.shared.store import (
    ANY_TURN,
    Announcement,
    Answer,
    Joined,
    Limits,
    Place,
    SharedStore,
    StoreUnreachable,
    Turn,
    announcement,
)
from gateway.admission.types import LedgerSnapshot, PoolKey, PoolSpec
from gateway.config.shared_ledger import SharedLedgerSettings

log = logging.getLogger("gateway.shared_ledger")
EMPTY = LedgerSnapshot()
RELEASE_RIDE_S = 0.002
"""How long a release may wait for the next reserve of its pool to carry it (steady traffic then costs one Redis
call per request, not two). Only the other replicas see the room back later, by at most this, and only while
nobody waits for the pool: with waiters anywhere the release goes at once."""


def shared_pools(config: SharedLedgerSettings) -> SharedPools | None:
    """The shared ledger when ``shared_ledger.redis_url`` is set, else None (the ledger lives in this process)."""
    if config.redis_url is None:
        return None
    store = SharedStore.from_url(config.redis_url.get_secret_value(), prefix=config.prefix, timeout_s=config.timeout_s,
                                 connections=config.connections)
    log.info("shared ledger: reservations, queues and rates are kept in Redis (prefix '%s'), leases of %g s; this "
             "replica is '%s'", config.prefix, config.lease_ttl_s, store.replica)
    return SharedPools(store, config)


class SharedPools:
    """See the module docstring. Single-threaded (the event loop's); the waiting room is its only caller."""

    def __init__(self, store: SharedStore, config: SharedLedgerSettings) -> None:
        self.store = store
        self._config = config
        self._others: dict[PoolKey, LedgerSnapshot] = {}
        self._mine: dict[PoolKey, dict[int, Reservation]] = {}
        self._pools: dict[PoolKey, PoolSpec] = {}
        self._named: dict[str, PoolKey] = {}  # pool names in Redis (what a 'freed' message carries)
        self._listener: PubSub | None = None
        self._queued: dict[PoolKey, int] = {}  # how many wait for each pool across replicas, as last announced
        self._announced: dict[PoolKey, LedgerSnapshot] = {}  # and its totals
        self._waiting: dict[PoolKey, set[int]] = {}  # this replica's waiters with a place in the shared queue
        self._tasks: set[asyncio.Task[None]] = set()
        self._limits: dict[int, Limits] = {}  # each live reservation's capacity rules, to add its lease back by
        self._releasing: dict[PoolKey, list[Reservation]] = {}  # released here, waiting for a ride to Redis
        self._sending: dict[PoolKey, dict[int, Reservation]] = {}  # released here, on their way (no answer yet)
        self._ride: asyncio.TimerHandle | None = None  # sends the releases no reserve carried
        self.fences = Fences(config.lease_ttl_s, config.fence_margin_s, self._fence_due)
        self._down_at_s = 0.0  # when Redis was found unreachable (the loop's clock)
        self._down_view: dict[PoolKey, tuple[LedgerSnapshot, LedgerSnapshot]] = {}  # others, mine: then
        self.up = True
        self.down_reason = ""
        self.down_total = 0
        self.expired_total = 0
        self.readded_total = 0
        self.lost_races_total = 0
        self.turns_kept_total = 0
        self.wakeups_total = 0

    def __repr__(self) -> str:
        return f"SharedPools({self.store!r}, up={self.up})"

    @property
    def config(self) -> SharedLedgerSettings:
        return self._config

    # --- planning ---------------------------------------------------------------------------------------------------

    def others(self, key: PoolKey) -> LedgerSnapshot:
        """What the other replicas hold in the pool, as this replica last saw it (see the module docstring)."""
        pool = self._pools.get(key)
        if not self.up and self._config.on_unreachable == "local_share" and pool is not None:
            known = self._down_view.get(key)
            if known is not None and _now_s() < self._down_at_s + self._config.lease_ttl_s:
                return known_share_others(pool, self._config.replicas, *known)  # their leases may still run
            return local_share_others(pool, self._config.replicas)
        return self._others.get(key, EMPTY)

    def waiting_across(self, key: PoolKey) -> int:
        """How many requests wait for the pool on every replica, as Redis last announced (0 while it is down)."""
        return self._queued.get(key, 0) if self.up else 0

    def refuse_if_down(self, key: PoolKey) -> None:
        if not self.up and self._config.on_unreachable == "refuse":
            raise AdmissionRejected(errors.ledger_unavailable(key, self.down_reason))

    def know(self, pool: PoolSpec) -> None:
        """Follow ``pool`` from now on. A pool new to this replica is read at once, in the background (its totals
        and Redis's epoch): should Redis go away or restart empty before the next renewal, this replica already
        knows what the others held, and that the leases were lost (``scripts.epoch``)."""
        if pool.key not in self._pools:
            self._named[self.store.pool_name(pool.key)] = pool.key
            if self.up:
                self._spawn(self._learn(pool.key))
        self._pools[pool.key] = pool

    async def _learn(self, key: PoolKey) -> None:
        try:
            renewed = await self.store.renew(key, [], self._config.lease_ttl_s)
        except StoreUnreachable as exc:
            self.went_down(str(exc))
            return
        self._saw(key, Answer("", renewed.expired, renewed.totals))

    async def watch(self, pools: Iterable[PoolSpec], *, timeout_s: float) -> None:
        """Follow these pools' totals from now on (announcements, renewals), reading those never read yet at once
        (within ``timeout_s``): the status of a replica that has not admitted into a pool still shows what the other
        replicas hold in it."""
        unseen = []
        for pool in pools:
            self.know(pool)
            if pool.key not in self._announced:
                unseen.append(pool.key)
        if unseen and self.up:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.refresh(unseen, touch=False), timeout=timeout_s)

    # --- commits and releases ---------------------------------------------------------------------------------------

    async def commit(self, reservation: Reservation, limits: Limits, turn: Turn = ANY_TURN, *,
                     queued: bool = False) -> bool:
        """Make a local reservation final across replicas: True when its lease is in Redis (or, Redis down with
        ``local_share``, when it was planned against this replica's share); False when another replica took the
        room first, it is not the request's turn in the fair order, or Redis just went away (plan again). With
        ``on_unreachable = "refuse"`` and Redis down, a request that never waited is refused (``AdmissionRejected``,
        503), and one that ``queued`` gets False: it waits on, up to its queue timeout, for Redis to come back.
        ``turn``: the request's place in the shared queue (its waiter; None: it has none, and its weight and priority
        place it)."""
        key = reservation.key
        waiter = None if turn.waiter is None else int(turn.waiter)  # this replica's waiters: its sequence numbers
        if not self.up:
            if queued and self._config.on_unreachable == "refuse":
                return False
            self.refuse_if_down(key)
            self._mine.setdefault(key, {})[reservation.id] = reservation  # added to Redis once it is back
            self._limits[reservation.id] = limits
            return True
        sent_s = _now_s()
        releasing = self._send(key)
        try:
            answer = await self.store.reserve(reservation, limits, self._config.lease_ttl_s, turn,
                                              releasing=releasing)
        except StoreUnreachable as exc:  # (the releases it carried expire on their own)
            self._sent(key, releasing)
            self.went_down(str(exc))
            if not queued:
                self.refuse_if_down(key)
            return False  # plan again: against this replica's share, or (refuse) once Redis is back
        self._sent(key, releasing)
        if answer.verdict == "ok":
            self._mine.setdefault(key, {})[reservation.id] = reservation
            self._limits[reservation.id] = limits
            self.fences.confirm((reservation.id,), sent_s)
            if waiter is not None:
                self._forget_waiter(key, waiter)  # the script took its place out of the queue
        elif answer.verdict == "behind":
            self.turns_kept_total += 1
        else:
            self.lost_races_total += 1
        self._saw(key, answer)
        return answer.verdict == "ok"

    async def resize(self, reservation: Reservation, tokens: int, pool_tokens: int) -> bool:
        """An elastic reply's growth step across replicas (one script call): True when its lease now holds
        ``tokens`` (the caller then resizes its own ledger, and tells ``resized``); False when the pool has no room
        across replicas, the lease is gone, or Redis is away (no growth without the shared check)."""
        if not self.up or self._mine.get(reservation.key, {}).get(reservation.id) is not reservation:
            return False
        try:
            answer = await self.store.resize(reservation, tokens, pool_tokens, self._config.lease_ttl_s)
        except StoreUnreachable as exc:
            self.went_down(str(exc))
            return False
        self._saw(reservation.key, answer)
        return answer.verdict == "ok"

    def resized(self, reservation: Reservation, resized: Reservation) -> None:
        """The local ledger's reservation after a growth step: renewals and re-adds carry its size from now on."""
        mine = self._mine.get(reservation.key)
        if mine is not None and mine.get(reservation.id) is reservation:
            mine[reservation.id] = resized

    def release(self, reservation: Reservation) -> None:
        """Drop the lease (in the background: the caller never waits on Redis to free a request): with the next
        reserve of its pool, within ``RELEASE_RIDE_S``, else on its own; at once when requests wait for the pool."""
        key = reservation.key
        self.fences.forget(reservation.id)
        self._limits.pop(reservation.id, None)
        mine = self._mine.get(key)
        if mine is None or mine.pop(reservation.id, None) is None:
            return
        if not mine:
            del self._mine[key]
        if not self.up:
            return
        self._releasing.setdefault(key, []).append(reservation)
        if self._queued.get(key, 0) > 0:
            self._send_releases(key)
        elif self._ride is None:
            self._ride = asyncio.get_running_loop().call_later(RELEASE_RIDE_S, self._send_all_releases)

    def _send_all_releases(self) -> None:
        self._ride = None
        for key in tuple(self._releasing):
            self._send_releases(key)

    def _send_releases(self, key: PoolKey) -> None:
        batch = self._send(key)
        if batch:
            self._spawn(self._release(key, batch))

    def _send(self, key: PoolKey) -> list[Reservation]:
        """The releases of the pool waiting for a ride, now on their way: until Redis answers the call that carries
        them they still count as this replica's (the totals it answers meanwhile may hold them)."""
        batch = self._releasing.pop(key, [])
        if batch:
            self._sending.setdefault(key, {}).update((r.id, r) for r in batch)
        return batch

    def _sent(self, key: PoolKey, batch: list[Reservation]) -> None:
        sending = self._sending.get(key)
        if sending is None:
            return
        for reservation in batch:
            sending.pop(reservation.id, None)
        if not sending:
            del self._sending[key]

    async def _release(self, key: PoolKey, batch: list[Reservation]) -> None:
        try:
            answer = await self.store.release(key, batch)
        except StoreUnreachable as exc:
            self._sent(key, batch)
            self.went_down(str(exc))  # the leases expire on their own
            return
        self._sent(key, batch)
        self._saw(key, answer)

    async def join_queue(self, key: PoolKey, seq: int, max_queue: int, place: Place) -> Joined | None:
        """Take a place in the pool's queue across replicas, and a fair tag from the pool's clock in Redis: how many
        wait with this one (more than ``max_queue``: no place); None when Redis is unreachable (the replica's own
        queue and tags still hold). The place is renewed with every poll while the request waits, and expires
        ``lease_ttl_s`` after the last."""
        if not self.up:
            return None
        try:
            joined = await self.store.join_queue(key, str(seq), max_queue, self._config.lease_ttl_s, place)
        except StoreUnreachable as exc:
            self.went_down(str(exc))
            return None
        self._queued[key] = joined.waiting  # its own joins are not announced back to it
        if joined.placed:
            self._waiting.setdefault(key, set()).add(seq)
            return joined
        return Joined(False, joined.waiting + 1)

    def leave_queue(self, key: PoolKey, seq: int) -> None:
        """A waiter leaves unserved: its place goes (in the background), and with it the room it kept."""
        if self._forget_waiter(key, seq) and self.up:
            self._spawn(self._leave(key, seq))

    def _forget_waiter(self, key: PoolKey, seq: int) -> bool:
        waiting = self._waiting.get(key)
        if waiting is None or seq not in waiting:
            return False
        waiting.discard(seq)
        if not waiting:
            del self._waiting[key]
        return True

    async def _leave(self, key: PoolKey, seq: int) -> None:
        try:
            await self.store.leave_queue(key, str(seq))
        except StoreUnreachable as exc:
            self.went_down(str(exc))  # the place expires on its own

    # --- background: renewals and fresh totals ----------------------------------------------------------------------

    async def renew_all(self) -> None:
        """Renew every live lease of this replica (and read every known pool's totals). A lease Redis no longer has
        (it expired while this replica was cut off, Redis lost it, or it was admitted while Redis was away) is added
        back only through the capacity-checked reserve script; where the pool has no room for it, its request is
        fenced."""
        keys = set(self._mine) | set(self._pools)
        for key in keys:
            live = [r for r in self._mine.get(key, {}).values() if not self.fences.is_fenced(r.id)]
            sent_s = _now_s()
            try:
                renewed = await self.store.renew(key, live, self._config.lease_ttl_s)
            except StoreUnreachable as exc:
                self.went_down(str(exc))
                return
            missing = {self.store.lease_id(r): r for r in live}
            lapsed = [missing[lease] for lease in renewed.missing if lease in missing]
            gone = {r.id for r in lapsed}
            still = self._mine.get(key, {})  # a request that ended while the renewal was on its way has no deadline
            self.fences.confirm((r.id for r in live if r.id not in gone and r.id in still), sent_s)
            lapsed = [r for r in lapsed if r.id in still]
            self._saw(key, Answer("", renewed.expired, renewed.totals))
            for reservation in lapsed:
                if not await self._add_back(reservation):
                    return
        self._came_back()

    async def _add_back(self, reservation: Reservation) -> bool:
        """Add a running request's missing lease back, capacity-checked, or fence the request; False when Redis
        went away meanwhile."""
        limits = self._limits.get(reservation.id)
        if limits is None:
            return True
        sent_s = _now_s()
        try:
            answer = await self.store.reserve(reservation, Limits(limits.slots, limits.pool_tokens, None, None),
                                              self._config.lease_ttl_s, readd=True)
        except StoreUnreachable as exc:
            self.went_down(str(exc))
            return False
        self._saw(reservation.key, answer)
        if reservation.id not in self._mine.get(reservation.key, {}):  # its request ended meanwhile
            if answer.verdict == "ok":  # its release went before this lease was back: drop it again
                self._spawn(self._release(reservation.key, [reservation]))
            return True
        if answer.verdict == "ok":
            self.readded_total += 1
            self.fences.confirm((reservation.id,), sent_s)
            log.warning("shared ledger: a lease of this replica in %s was missing from Redis (expired or lost) and "
                        "was added back: the pool had room for it", _where(reservation.key))
            return True
        self._fence(reservation, f"its lease in the shared ledger was gone (expired or lost in Redis) and the pool "
                                 f"no longer has room for it ({answer.verdict} taken by other requests)")
        return True

    def _fence_due(self, leases: list[int]) -> None:
        ttl_s, margin_s = self._config.lease_ttl_s, self._config.fence_margin_s
        due = set(leases)
        for reservation in [r for mine in self._mine.values() for r in mine.values() if r.id in due]:
            self._fence(reservation, f"its lease in the shared ledger could not be renewed for {ttl_s - margin_s:g} s "
                                     f"(Redis: {self.down_reason if not self.up else 'no answer in time'}) and "
                                     f"may expire in {margin_s:g} s (shared_ledger.lease_ttl_s = {ttl_s:g}, "
                                     f"fence_margin_s = {margin_s:g})")

    def _fence(self, reservation: Reservation, why: str) -> None:
        log.error("shared ledger: fenced a request in %s (%d tokens): %s", _where(reservation.key), reservation.tokens,
                  why)
        self.fences.fence(reservation.id, AdmissionRejected(errors.ledger_fenced(reservation.key, why)))

    async def refresh(self, keys: Iterable[PoolKey], *, touch: bool = True) -> None:
        """Read the totals of the pools whose requests wait (and renew those requests' places)."""
        for key in keys:
            try:
                if touch:
                    await self.store.touch_queue(key, [str(seq) for seq in self._waiting.get(key, ())],
                                                 self._config.lease_ttl_s)
                answer = await self.store.totals(key)
            except StoreUnreachable as exc:
                self.went_down(str(exc))
                return
            self._saw(key, answer)

    async def run(self, waiting: Callable[[], Iterable[PoolKey]], redispatch: Callable[[PoolKey], None]) -> None:
        """Until cancelled: renew leases every third of the ttl; while requests wait, read their pools' totals
        every ``poll_s`` and let the waiting room dispatch again, and in between do so for a pool at once when
        any replica frees room in it."""
        renew_every_s = self._config.lease_ttl_s / 3
        loop = asyncio.get_running_loop()
        next_renewal_s = loop.time()
        try:
            with contextlib.suppress(StoreUnreachable):  # down: the first renewal says so, and reads it then
                await self.store.learn_epoch()
            while True:
                if loop.time() >= next_renewal_s or not self.up:
                    await self.renew_all()
                    next_renewal_s = loop.time() + renew_every_s
                keys = tuple(waiting()) if self.up or self._config.on_unreachable == "local_share" else ()
                if keys:  # (refuse, Redis down: waiters wait for it to come back, not for a poll)
                    await self.refresh(keys)
                    for key in keys:
                        redispatch(key)
                pause_s = self._config.poll_s if keys or not self.up else 0.5
                await self._hear_freed(min(loop.time() + pause_s, next_renewal_s), waiting, redispatch)
        finally:
            await self._stop_listening()

    async def _hear_freed(self, until_s: float, waiting: Callable[[], Iterable[PoolKey]],
                          redispatch: Callable[[PoolKey], None]) -> None:
        """Until ``until_s``: take in every pool's changes as the scripts announce them (totals and how many wait,
        for routing and planning), and when a pool with requests waiting here changed (a release, an expired lease or
        a departed waiter on any replica), let its waiters try at once."""
        loop = asyncio.get_running_loop()
        while (left_s := until_s - loop.time()) > 0:
            heard = await self._next_announcement(left_s)
            key = None if heard is None else self._named.get(heard.pool)
            if heard is None or key is None:
                continue
            before, waited = self._announced.get(key), self._queued.get(key, 0)
            self._announced[key] = heard.totals
            self._queued[key] = heard.waiting
            self._others[key] = combine(heard.totals, self._in_redis_for_me(key), sign=-1)
            room_back = before is None or heard.waiting < waited or freed(before, heard.totals)
            if room_back and key in set(waiting()):  # a lease or a waiter that kept room is gone: try again
                self.wakeups_total += 1
                redispatch(key)

    async def _next_announcement(self, timeout_s: float) -> Announcement | None:
        """The next change of a pool announced on the ledger's channel within ``timeout_s``, or None."""
        if not self.up:
            await asyncio.sleep(timeout_s)
            return None
        try:
            if self._listener is None:
                listener = self.store.subscriber()
                self._listener = listener
                await listener.subscribe(self.store.channel)
            message = await self._listener.get_message(ignore_subscribe_messages=True, timeout=timeout_s)
        except (RedisError, OSError):  # the next renewal says whether Redis is gone; listen again after it
            await self._stop_listening()
            await asyncio.sleep(timeout_s)
            return None
        if message is None or message.get("type") != "message":
            return None
        return announcement(message.get("data", b""), skip_replica=self.store.replica)

    async def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(RedisError, OSError):
                await listener.aclose()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        self.fences.close()
        if self._ride is not None:
            self._ride.cancel()
        self._send_all_releases()  # what waited for a ride goes now: a replica that stops leaves no lease behind
        for task in tuple(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=self._config.timeout_s)
        await self.store.close()

    # --- state ------------------------------------------------------------------------------------------------------

    def mine(self, key: PoolKey) -> LedgerSnapshot:
        """This replica's live leases in the pool."""
        return _tally(self._mine.get(key, {}).values())

    def _in_redis_for_me(self, key: PoolKey) -> LedgerSnapshot:
        """What of the pool's totals in Redis may be this replica's: its live leases, and those it released that
        Redis has not been told of yet, or not answered (the others' share is the totals less these)."""
        releasing, sending = self._releasing.get(key, ()), self._sending.get(key, {}).values()
        return _tally([*self._mine.get(key, {}).values(), *releasing, *sending])

    def _saw(self, key: PoolKey, answer: Answer) -> None:
        self.expired_total += answer.expired
        if answer.expired:
            log.warning("shared ledger: %d lease(s) in %s expired (a replica stopped renewing them); their tokens "
                        "are free again", answer.expired, _where(key))
        self._others[key] = combine(answer.totals, self._in_redis_for_me(key), sign=-1)
        self._announced[key] = answer.totals  # what the next announcement is compared with

    def went_down(self, reason: str) -> None:
        if self.up:
            self.up = False
            self._down_at_s = _now_s()
            # a pool whose totals this replica never read: the others may hold all of it but this replica's part
            self._down_view = {key: (self._others.get(key, whole_pool(pool)), self.mine(key))
                               for key, pool in self._pools.items()}
            self.down_total += 1
            self.down_reason = reason or "no answer"
            policy = ("new requests are refused (503)" if self._config.on_unreachable == "refuse"
                      else f"each replica admits into 1/{self._config.replicas} of every pool")
            log.error("shared ledger: Redis is unreachable (%s); on_unreachable = %s: %s until it is back",
                      self.down_reason, self._config.on_unreachable, policy)

    def _came_back(self) -> None:
        if not self.up:
            self.up = True
            log.warning("shared ledger: Redis answers again; this replica's leases are renewed into it and "
                        "admission is shared again")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _tally(reservations: Iterable[Reservation]) -> LedgerSnapshot:
    active: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    sequences = held = 0
    for reservation in reservations:
        active[reservation.tenant] += reservation.sequences
        tokens[reservation.tenant] += reservation.tokens
        sequences += reservation.sequences
        held += reservation.tokens
    return LedgerSnapshot(sequences, held, active, tokens)


def _now_s() -> float:
    return asyncio.get_running_loop().time()


def _where(key: PoolKey) -> str:
    return f"model '{key.model}' on backend '{key.backend}'"
