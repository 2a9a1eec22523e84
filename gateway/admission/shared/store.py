"""The shared ledger's Redis side: one call per operation, each an atomic script (``scripts.py``).

``SharedStore`` speaks to Redis and nothing else: it turns reservations into leases and the scripts' answers into
``LedgerSnapshot``s of the whole pool (every replica's leases). Whoever calls it decides what to do with them
(``pools.SharedPools``). A call that can't reach Redis within ``timeout_s`` raises ``StoreUnreachable``.

The scripts go on one pipelined connection of their own (``script_line.ScriptLine``); the client's pool serves the
rest (the announcements' subscription, the GPU leases), and the scripts too where the URL is TLS or a Unix socket.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.admission.ledger import Reservation
from gateway.admission.rates import RateLimit, RateRefusal
from gateway.admission.shared import scripts
from gateway.admission.shared.script_line import ReplyError, ScriptLine, script_sha
from gateway.admission.types import LedgerSnapshot, PoolKey


class StoreUnreachable(Exception):
    """Redis did not answer (refused, timed out, or an error that is not a script's answer)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a pool allows, for the reserve script to check again atomically: the planner's capacity rules."""

    slots: int
    pool_tokens: int | None  # unified pools only
    tenant_max_active: int | None
    tenant_share_tokens: int | None


@dataclass(frozen=True, slots=True)
class Answer:
    """A script's answer: its verdict ('ok', 'slots', 'tokens', 'tenant_active', 'tenant_share'; or a count),
    the leases it found expired, and the pool's totals across replicas afterwards."""

    verdict: str
    expired: int
    totals: LedgerSnapshot


@dataclass(frozen=True, slots=True)
class Place:
    """A waiter's place in a pool's queue across replicas: what it will reserve, and where the fair order puts it."""

    tokens: int
    sequences: int
    tenant: str
    weight: float = 1.0
    priority: int = 0
    tenant_max_active: int | None = None
    tenant_share_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Joined:
    """``join_queue``'s answer: whether the waiter has a place, how many wait with it, and its fair tag."""

    placed: bool
    waiting: int
    start: float = 0.0
    finish: float = 0.0
    arrival_ms: float = 0.0  # on Redis's clock: the fair order's next key after the start tag


def pool_name(prefix: str, key: PoolKey) -> str:
    """The pool's name in Redis; the backend's name is length-prefixed so no two pools' names can collide."""
    return f"{prefix}:pool:{len(key.backend)}:{key.backend}:{key.model}"


def _names(prefix: str, key: PoolKey) -> list[str]:
    base = pool_name(prefix, key)
    parts = ("leases", "expiry", "totals", "queue", "qexp", "qinfo", "fair")
    return [*(f"{base}:{part}" for part in parts), f"{prefix}:epoch"]


@dataclass(frozen=True, slots=True)
class Renewed:
    """``renew``'s answer: the leases it did not find (expired or lost: never added back by a renewal), the leases
    it found expired, and the pool's totals afterwards."""

    missing: tuple[str, ...]
    expired: int
    totals: LedgerSnapshot


@dataclass(frozen=True, slots=True)
class Announcement:
    """A pool changed: its name in Redis, how many wait for it across replicas, its totals, and which replica
    changed it."""

    pool: str
    waiting: int
    totals: LedgerSnapshot
    replica: str


def announcement(data: bytes | str, *, skip_replica: str | None = None) -> Announcement | None:
    """A message of the ledger's channel, or None if it is not one of the scripts' (``[pool, waiting, flat,
    replica]``) or it is ``skip_replica``'s own (that replica has the totals from the script's answer)."""
    try:
        pool, waiting, flat, replica = orjson.loads(data)
        if replica == skip_replica:
            return None
        return Announcement(str(pool), int(waiting), _snapshot(flat if isinstance(flat, list) else []), str(replica))
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None


def _snapshot(flat: Sequence[Any]) -> LedgerSnapshot:
    values = {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
    active: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for name, value in values.items():
        if name.startswith("a:") and value > 0:
            active[name[2:]] = value
        elif name.startswith("t:") and value > 0:
            tokens[name[2:]] = value
    return LedgerSnapshot(max(0, values.get("seqs", 0)), max(0, values.get("tokens", 0)), active, tokens)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Turn:
    """A request's place in the pool's fair order across replicas."""

    waiter: str | None = None
    """Its own place in the queue; None when it did not queue, and then it is placed where ``weight`` and
    ``priority`` would tag it now."""
    overtake_s: float = 5.0
    weight: float = 1.0
    priority: int = 0


ANY_TURN = Turn()
"""A request that did not queue, placed by the default weight and priority."""


class SharedStore:
    """Leases, queue places and rate buckets in one Redis; see the module docstring."""

    def __init__(self, client: aioredis.Redis, *, prefix: str = "kvgate", replica: str | None = None) -> None:
        self._redis = client
        self._prefix = prefix
        self.replica = replica or uuid.uuid4().hex[:12]
        self.epoch = ""  # the epoch of Redis's data this store last saw (``scripts.epoch``): a restart shows
        self._line = ScriptLine.for_pool(client.connection_pool)
        """Every script call goes on this one pipelined connection (script_line.py); None (TLS, a Unix socket):
        redis-py's own calls."""
        self._reserve = self._script(scripts.RESERVE)
        self._release = self._script(scripts.RELEASE)
        self._resize = self._script(scripts.RESIZE)
        self._renew = self._script(scripts.RENEW)
        self._epoch = self._script(scripts.EPOCH)
        self._totals = self._script(scripts.TOTALS)
        self._join = self._script(scripts.QUEUE_JOIN)
        self._touch = self._script(scripts.QUEUE_TOUCH)
        self._leave = self._script(scripts.QUEUE_LEAVE)
        self._rate_take = self._script(scripts.RATE_TAKE)
        self._rate_settle = self._script(scripts.RATE_SETTLE)

    def _script(self, source: str) -> _Script:
        return _Script(script_sha(source), source, self._redis.register_script(source))

    @property
    def client(self) -> aioredis.Redis:
        """The Redis client and its pool, for the other Redis users of this replica (the GPU leases, shared_gpu)."""
        return self._redis

    @property
    def channel(self) -> str:
        """Where the scripts announce every change of a pool (``announcement`` reads the message)."""
        return f"{self._prefix}:freed"

    def pool_name(self, key: PoolKey) -> str:
        return pool_name(self._prefix, key)

    def _herald(self, key: PoolKey) -> list[str | int | float]:
        """What the scripts announce a change of the pool with: the channel, the pool's name and who changed it."""
        return [self.channel, self.pool_name(key), self.replica]

    def subscriber(self) -> PubSub:
        """A connection of its own that hears ``channel`` (the caller subscribes, reads and closes it)."""
        return self._redis.pubsub(ignore_subscribe_messages=True)

    @classmethod
    def from_url(cls, url: str, *, prefix: str, timeout_s: float, connections: int = 32) -> SharedStore:
        """A store on its own pool of at most ``connections``: a call while all are busy waits for one, up to
        ``timeout_s`` (redis-py's default pool fails such a call at once, 'Too many connections': under load that
        looked like Redis down and refused requests)."""
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=connections, timeout=timeout_s, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, retry_on_timeout=False, health_check_interval=30)
        return cls(aioredis.Redis.from_pool(pool), prefix=prefix)  # closed with the client

    def __repr__(self) -> str:  # the URL may carry a password: never shown
        return f"SharedStore(prefix={self._prefix!r}, replica={self.replica!r})"

    async def close(self) -> None:
        if self._line is not None:
            await self._line.close()
        await self._redis.aclose()

    def lease_id(self, reservation: Reservation) -> str:
        return f"{self.replica}:{reservation.id}"

    def _value(self, reservation: Reservation) -> str:
        return f"{reservation.tokens}|{reservation.sequences}|{self.replica}|{reservation.tenant}"

    async def reserve(self, reservation: Reservation, limits: Limits, ttl_s: float, turn: Turn = ANY_TURN, *,
                      readd: bool = False, releasing: Sequence[Reservation] = ()) -> Answer:
        """Add the lease if the pool, across replicas, still has room for it (the planner's rules, atomically) and
        it is the request's ``turn`` in the fair order: what is left once the waiters ahead of it have taken theirs
        holds it. Verdict ``behind``: not its turn yet. ``readd``: the request already runs (its lease expired or was
        lost): only the pool's room is checked. ``releasing``: leases of this replica in the same pool to drop first,
        in the same call (releases waiting for a ride, ``SharedPools.release``)."""
        waiter, overtake_s, weight, priority = turn.waiter, turn.overtake_s, turn.weight, turn.priority
        args: list[str | int | float] = [
            self.lease_id(reservation), self._value(reservation), reservation.tokens, reservation.sequences,
            reservation.tenant, _ms(ttl_s), limits.slots, _or_none(limits.pool_tokens),
            _or_none(limits.tenant_max_active), _or_none(limits.tenant_share_tokens),
            "" if waiter is None else f"{self.replica}:{waiter}", _ms(overtake_s), weight, priority,
            *self._herald(reservation.key), "1" if readd else "", self.epoch,
            *(self.lease_id(r) for r in releasing)]
        return await self._call(self._reserve, _names(self._prefix, reservation.key), args)

    async def release(self, key: PoolKey, reservations: Sequence[Reservation]) -> Answer:
        """Drop these leases of the pool ``key`` (one call for the batch)."""
        args = [*self._herald(key), *(self.lease_id(r) for r in reservations)]
        return await self._call(self._release, _names(self._prefix, key), args)

    async def resize(self, reservation: Reservation, tokens: int, pool_tokens: int | None, ttl_s: float) -> Answer:
        """The lease holds ``tokens`` from now on, if the pool across replicas has room (``scripts.RESIZE``)."""
        args: list[str | int | float] = [self.lease_id(reservation), tokens, _or_none(pool_tokens), _ms(ttl_s)]
        return await self._call(self._resize, _names(self._prefix, reservation.key), args)

    async def learn_epoch(self) -> None:
        """Read Redis's epoch (``scripts.EPOCH``), as this replica starts: a restart empty is then noticed whichever
        replica calls first."""
        self.epoch = _text(await self._attempt(self._epoch, [f"{self._prefix}:epoch"], []))

    async def renew(self, key: PoolKey, live: Sequence[Reservation], ttl_s: float) -> Renewed:
        """Push the expiry of this replica's live leases in the pool that still exist; name those that do not (the
        caller adds each back with ``reserve(readd=True)``, capacity-checked, or ends its request)."""
        args = [_ms(ttl_s), *self._herald(key), self.epoch, *(self.lease_id(r) for r in live)]
        missing, expired, flat, epoch = await self._attempt(self._renew, _names(self._prefix, key), args)
        self.epoch = _text(epoch)
        return Renewed(tuple(_text(lease) for lease in missing), int(expired), _snapshot(flat))

    async def totals(self, key: PoolKey) -> Answer:
        return await self._call(self._totals, _names(self._prefix, key), self._herald(key))

    async def join_queue(self, key: PoolKey, waiter: str, max_queue: int, ttl_s: float, place: Place) -> Joined:
        """Take a place in the pool's queue across replicas, unless ``max_queue`` are already waiting, and a fair
        tag from the pool's clock in Redis (joining again keeps both). The place expires after ``ttl_s`` unless
        ``touch_queue`` renews it."""
        args: list[str | int | float] = [
            f"{self.replica}:{waiter}", _ms(ttl_s), max_queue, place.tokens, place.sequences, place.priority,
            _or_none(place.tenant_max_active), _or_none(place.tenant_share_tokens), place.weight, place.tenant,
            *self._herald(key)]
        answer = await self._attempt(self._join, _names(self._prefix, key), args)
        if not answer[0]:
            return Joined(False, int(answer[1]))
        _, waiting, start, finish, arrival_ms = answer
        return Joined(True, int(waiting), float(_text(start)), float(_text(finish)), float(arrival_ms))

    async def touch_queue(self, key: PoolKey, waiters: Sequence[str], ttl_s: float) -> None:
        if not waiters:
            return
        await self._attempt(self._touch, _names(self._prefix, key),
                            [_ms(ttl_s), *(f"{self.replica}:{w}" for w in waiters)])

    async def leave_queue(self, key: PoolKey, waiter: str) -> None:
        await self._attempt(self._leave, _names(self._prefix, key), [f"{self.replica}:{waiter}", *self._herald(key)])

    async def take_rate(self, tenant: str, limit: RateLimit, prompt_tokens: int) -> RateRefusal | None:
        """The tenant's buckets across replicas: one request and the prompt's tokens, or neither and why not."""
        keys = [f"{self._prefix}:rate:requests:{tenant}", f"{self._prefix}:rate:tokens:{tenant}"]
        args = [_or_none(limit.requests_per_minute), _or_none(limit.tokens_per_minute), prompt_tokens]
        ok, wait_ms, which = await self._attempt(self._rate_take, keys, args)
        if ok:
            return None
        rate = (f"{limit.requests_per_minute:,} requests per minute" if _text(which) == "requests"
                else f"{limit.tokens_per_minute:,} tokens per minute")
        if int(wait_ms) < 0:
            return RateRefusal(math.inf, f"the prompt is {prompt_tokens:,} tokens, more than tenant '{tenant}' may "
                               f"send in a minute ({rate})")
        return RateRefusal(int(wait_ms) / 1000.0, f"tenant '{tenant}' is over its rate of {rate}")

    async def settle_rate(self, tenant: str, limit: RateLimit, output_tokens: int) -> None:
        if limit.tokens_per_minute is None or output_tokens == 0:  # negative: a refund (rate_charge.py)
            return
        await self._attempt(self._rate_settle, [f"{self._prefix}:rate:tokens:{tenant}"],
                            [limit.tokens_per_minute, output_tokens])

    async def _call(self, script: _Script, keys: list[str], args: Sequence[str | int | float]) -> Answer:
        verdict, expired, flat, *epoch = await self._attempt(script, keys, args)
        if epoch:
            self.epoch = _text(epoch[0])
        return Answer(_text(verdict), int(expired), _snapshot(flat))

    async def _attempt(self, script: _Script, keys: list[str], args: Sequence[str | int | float]) -> Any:
        """Run the script, once more after a connection error (a connection Redis closed, as after its restart,
        fails once and is replaced); a second failure means Redis is unreachable."""
        line = self._line
        for attempt in (1, 2):
            try:
                if line is not None:
                    return await line.evalsha(script.sha, script.source, keys, args)
                return await script.fallback(keys=keys, args=list(args))
            except (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError) as exc:
                if attempt == 2:
                    raise StoreUnreachable(str(exc) or type(exc).__name__) from exc
            except (RedisError, ReplyError, OSError) as exc:
                raise StoreUnreachable(str(exc) or type(exc).__name__) from exc
        raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class _Script:
    sha: str
    source: str
    fallback: AsyncScript
    """redis-py's, for a store without a script line."""


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _or_none(value: int | None) -> int:
    return -1 if value is None else value
