"""One GPU ledger across replicas: load decisions on a backend made by one replica at a time, through Redis.

Theory of operation
-------------------
On one kvgate, ``LoadGate`` serialises what it decides, unloads and loads on a backend under one lock, so two
requests for two models that don't fit together never start two loads. Replicas sharing a ledger
(``[shared_ledger]``) each had their own lock: two could read the same free GPU at once, each decide a load that fits
alone, and each unload the other's freshly loaded model (measured: 3 replicas, 3 models that don't fit together, 6 of
9 requests failed; tests/e2e/test_shared_loads.py). Here the lock becomes a lease in Redis, one per backend:

    {prefix}:gpu:{len}:{backend}          hash: holder (replica:token), and while a load is in flight its model and
                                          bytes; expires lease_ttl_s after the holder's last renewal
    {prefix}:gpu:{len}:{backend}:loaded   hash: model -> when (Redis's clock) and by which replica it was last loaded

- **One replica at a time** decides, unloads and loads on a backend: ``hold`` waits (polling every
  ``LEASE_POLL_S``) until the lease is free, takes it, and renews it every third of ``lease_ttl_s`` while held (a
  load may take longer than the ttl). The local lock is taken first, so a replica's own requests queue in process
  and only one of them polls Redis.
- **A load in flight is counted by every replica**: the holder writes the model and its bytes on the lease before it
  asks the backend to load (``Held.loading``); ``in_flight`` reads them, and the GPU ledger (``gpu_reading``) adds them
  to the reserved bytes of every other replica's reading.
- **A model another replica just loaded is not unloaded from under the requests it was loaded for**: the lease's
  answer carries when each model was last loaded and by whom; the gate treats a model loaded elsewhere within one
  ``lease_ttl_s`` (at most ``residency.load_wait_s``) as awaited: by then the requests it was loaded for hold leases
  in its pool, or their replica died and would have lost them by then anyway. After that the other replicas' leases
  in the model's pool (the shared ledger, read afresh under the lease: ``ActiveSequences.refresh_active``) say
  whether it is in use, so a model another replica runs requests on is never unloaded as idle.
- **A replica that dies mid-load** stops renewing: its lease, the in-flight bytes with it, expires within
  ``lease_ttl_s`` and the next replica decides with a fresh GPU reading (which by then shows what the load took).
- **Every other replica hears of a change**: the models a holder loaded or unloaded are announced on
  ``{prefix}:gpu:changed`` as it gives the lease back (in the same script); each replica follows the channel
  (``follow``) and reads those models' pools anew, so a request there never runs on a layout that is gone (the
  backend would load the model again past every check: measured, 2 replicas taking turns on two models that don't
  fit together, Ollama's scheduler evicted 6 times without the announcements, 0 with them). A replica that lost the
  channel for a while reads every pool anew once it is back.
- **Redis unreachable**: ``hold`` raises ``GpuLedgerUnreachable``; the gate answers as ``shared_ledger.on_unreachable``
  says (``refuse``: 503 ``ledger_unavailable``; ``local_share``: this replica decides alone, with a WARNING, so two
  replicas may again decide at once until Redis is back).

Nothing else is kept: no prompt, no key. Each operation is one script (atomic), so a holder check and its write
never interleave with another replica's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

LEASE_POLL_S = 0.05
"""How often a replica waiting for another's lease asks again (loads are rare; a wait lasts one load)."""
FOLLOW_WAIT_S = 1.0
"""How long one read of the announcements waits (the loop then reads again)."""
FOLLOW_RETRY_S = 1.0
"""How long after losing the announcements a replica subscribes again."""
LOADED_KEPT_S = 3600.0
"""How long a load is remembered in Redis (older entries are dropped as the lease is taken)."""

_ACQUIRE = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local holder = redis.call('HGET', KEYS[1], 'holder')
local got = 0
if not holder then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'holder', ARGV[1])
  holder = ARGV[1]
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  got = 1
end
local out = {got, holder, redis.call('HGET', KEYS[1], 'model') or '', redis.call('HGET', KEYS[1], 'bytes') or '0'}
local loaded = redis.call('HGETALL', KEYS[2])
for i = 1, #loaded, 2 do
  local at, by = string.match(loaded[i + 1], '^(%d+)|(.*)$')
  local age = now - tonumber(at)
  if age > tonumber(ARGV[3]) then
    redis.call('HDEL', KEYS[2], loaded[i])
  else
    table.insert(out, loaded[i])
    table.insert(out, age)
    table.insert(out, by)
  end
end
return out
"""
"""Take the lease (or renew it, for its holder); either way answer who holds it, the load in flight, and the loads
remembered: ``got, holder, model, bytes, (model, age_ms, replica)...``."""

_LOADING = """
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'model', ARGV[2], 'bytes', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

_RENEW = """
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_RELEASE = """
local mine = redis.call('HGET', KEYS[1], 'holder') == ARGV[1]
if mine then redis.call('DEL', KEYS[1]) end
if ARGV[2] ~= '' then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[2], ARGV[2], (t[1] * 1000 + math.floor(t[2] / 1000)) .. '|' .. ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if #ARGV > 6 then
  local models = {}
  for i = 7, #ARGV do table.insert(models, ARGV[i]) end
  redis.call('PUBLISH', ARGV[5], cjson.encode({backend = ARGV[6], replica = ARGV[4], models = models}))
end
if mine then return 1 end
return 0
"""
"""Give the lease back (only its holder can); with a model named, remember that this replica loaded it now; with
models changed (loaded or unloaded under the lease), announce them to the other replicas."""

_PEEK = """
return {redis.call('HGET', KEYS[1], 'holder') or '', redis.call('HGET', KEYS[1], 'model') or '',
        redis.call('HGET', KEYS[1], 'bytes') or '0'}
"""


class GpuLedgerUnreachable(Exception):
    """Redis did not answer a lease call (refused, timed out, or an error that is not a script's answer)."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """A load another replica has asked a backend for and not seen finish."""

    model: str
    load_bytes: int
    replica: str


@dataclass(frozen=True, slots=True)
class LoadedElsewhere:
    """A model another replica loaded ``age_s`` ago (Redis's clock)."""

    model: str
    age_s: float


class Held:
    """The lease on one backend, held by this replica until ``release`` (renewed meanwhile)."""

    def __init__(self, gpu: SharedGpu, backend: str, token: str, loaded_elsewhere: tuple[LoadedElsewhere, ...]) -> None:
        self._gpu = gpu
        self.backend = backend
        self.token = token
        self.loaded_elsewhere = loaded_elsewhere
        """What the other replicas loaded on this backend lately, as the lease was taken."""
        self.lost = False
        """A renewal found the lease gone (expired while this replica could not renew it, or Redis restarted)."""
        self._loaded = ""
        self._changed: dict[str, None] = {}
        self._released = False
        self._renewal: asyncio.Future[None] | None = asyncio.ensure_future(self._renew_until_released())

    def __repr__(self) -> str:
        return f"Held({self.backend!r}, lost={self.lost})"

    async def loading(self, model: str, load_bytes: int) -> None:
        """A load of ``model`` (``load_bytes``) is about to be asked: counted by every replica until it ends."""
        ok = await self._gpu._run(self._gpu._loading, self.backend,
                                  [self.token, model, load_bytes, _ms(self._gpu.ttl_s)])
        if not ok:
            self._lose("writing the load in flight")

    def loaded(self, model: str) -> None:
        """``model`` loaded under this lease: remembered in Redis, and announced, as the lease is given back."""
        self._loaded = model
        self._changed[model] = None

    def unloaded(self, model: str) -> None:
        """``model`` unloaded (or asked to be) under this lease: announced as the lease is given back."""
        self._changed[model] = None

    async def release(self) -> None:
        """Give the lease back (once; later calls do nothing); a failure to reach Redis is logged, and the lease then
        expires on its own within ``lease_ttl_s``."""
        renewal, self._renewal = self._renewal, None
        if renewal is None:
            return
        self._released = True  # the renewal ends at its next step even where the cancel below is not seen
        renewal.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewal
        try:
            await self._gpu._run(self._gpu._release, self.backend,
                                 [self.token, self._loaded, _ms(LOADED_KEPT_S), self._gpu.replica,
                                  self._gpu.channel, self.backend, *self._changed])
        except GpuLedgerUnreachable as exc:
            log.warning("shared GPU ledger: could not give back the lease on backend '%s' (%s); it expires within "
                        "%g s", self.backend, exc, self._gpu.ttl_s)

    def abandon(self) -> None:
        """Stop renewing without giving the lease back: what a replica that dies does (the lease then expires)."""
        renewal, self._renewal = self._renewal, None
        self._released = True
        if renewal is not None:
            renewal.cancel()

    async def _renew_until_released(self) -> None:
        """Renew every third of the ttl until released. A cancel that lands while a renewal's script call is in
        flight can be lost inside the Redis client (seen: ``release`` then waited for ever, the lease renewed on,
        about one run in ten of tests/loads/test_shared_gpu.py), so the loop also stops on ``_released``."""
        while not self._released:
            await asyncio.sleep(self._gpu.ttl_s / 3)
            if self._released:
                return
            try:
                if not await self._gpu._run(self._gpu._renew, self.backend, [self.token, _ms(self._gpu.ttl_s)]):
                    self._lose("renewing it")
                    return
            except GpuLedgerUnreachable as exc:
                log.error("shared GPU ledger: could not renew the lease on backend '%s' (%s); it expires within %g s "
                          "unless a renewal gets through", self.backend, exc, self._gpu.ttl_s)

    def _lose(self, doing: str) -> None:
        if not self.lost:
            self.lost = True
            log.error("shared GPU ledger: the lease on backend '%s' was gone when %s (it expired, or Redis restarted "
                      "empty): another replica may decide loads there meanwhile", self.backend, doing)


class SharedGpu:
    """The leases of every backend's GPU in one Redis; see the module docstring. Single-threaded (the event loop's)."""

    def __init__(self, client: aioredis.Redis, *, prefix: str, replica: str, ttl_s: float,
                 poll_s: float = LEASE_POLL_S) -> None:
        self._redis = client
        self._prefix = prefix
        self.replica = replica
        self.ttl_s = ttl_s
        self._poll_s = poll_s
        self._tokens = itertools.count(1)
        self._acquire = client.register_script(_ACQUIRE)
        self._loading = client.register_script(_LOADING)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._peek = client.register_script(_PEEK)
        self.waits_total = 0
        """Times a lease was found held by another replica (a decision waited for theirs)."""

    def __repr__(self) -> str:  # the client's URL may carry a password: never shown
        return f"SharedGpu(prefix={self._prefix!r}, replica={self.replica!r})"

    @property
    def channel(self) -> str:
        """Where the models a holder loaded or unloaded are announced (``follow`` hears them)."""
        return f"{self._prefix}:gpu:changed"

    async def follow(self, changed: Callable[[str, tuple[str, ...]], None], missed: Callable[[], None]) -> None:
        """Until cancelled: call ``changed(backend, models)`` for every change another replica announces; after the
        channel was lost (Redis away), ``missed()`` once it is heard again (what changed meanwhile is unknown)."""
        lost = False
        while True:
            listener = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await listener.subscribe(self.channel)
                if lost:
                    lost = False
                    log.info("shared GPU ledger: hearing the other replicas' model loads again")
                    missed()
                while True:
                    message = await listener.get_message(ignore_subscribe_messages=True, timeout=FOLLOW_WAIT_S)
                    if message is not None:
                        heard = _change(message.get("data"), skip_replica=self.replica)
                        if heard is not None:
                            changed(*heard)
            except (RedisError, OSError) as exc:
                if not lost:
                    lost = True
                    log.warning("shared GPU ledger: can't hear the other replicas' model loads (%s); every pool is "
                                "read anew once Redis answers", exc or type(exc).__name__)
                await asyncio.sleep(FOLLOW_RETRY_S)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await listener.aclose()  # type: ignore[no-untyped-call]

    def _keys(self, backend: str) -> list[str]:
        lease = f"{self._prefix}:gpu:{len(backend)}:{backend}"  # length-prefixed: no two backends' names collide
        return [lease, f"{lease}:loaded"]

    async def hold(self, backend: str) -> Held:
        """The lease on ``backend``'s GPU, once no other replica holds it. Raises ``GpuLedgerUnreachable``."""
        token = f"{self.replica}:{next(self._tokens)}"
        waited = False
        while True:
            answer = await self._run(self._acquire, backend, [token, _ms(self.ttl_s), _ms(LOADED_KEPT_S)])
            got, holder = int(answer[0]), _text(answer[1])
            if got:
                rest = answer[4:]
                elsewhere = tuple(LoadedElsewhere(_text(rest[i]), int(rest[i + 1]) / 1000.0)
                                  for i in range(0, len(rest), 3) if _text(rest[i + 2]) != self.replica)
                return Held(self, backend, token, elsewhere)
            if not waited:
                waited = True
                self.waits_total += 1
                log.info("shared GPU ledger: loads on backend '%s' wait for replica '%s'", backend,
                         holder.rsplit(":", 1)[0])
            await asyncio.sleep(self._poll_s)

    async def in_flight(self, backend: str) -> InFlight | None:
        """The load another replica has in flight on ``backend`` (None: none, or it is this replica's)."""
        holder, model, load_bytes = (_text(v) for v in await self._run(self._peek, backend, []))
        if not model or holder.rsplit(":", 1)[0] == self.replica:
            return None
        return InFlight(model, int(load_bytes), holder.rsplit(":", 1)[0])

    async def _run(self, script: Any, backend: str, args: list[Any]) -> Any:
        """One script, once more after a connection error (a pooled connection Redis closed fails once)."""
        for attempt in (1, 2):
            try:
                return await script(keys=self._keys(backend), args=args)
            except (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError) as exc:
                if attempt == 2:
                    raise GpuLedgerUnreachable(str(exc) or type(exc).__name__) from exc
            except (RedisError, OSError) as exc:
                raise GpuLedgerUnreachable(str(exc) or type(exc).__name__) from exc
        raise AssertionError("unreachable")


def _change(data: Any, *, skip_replica: str) -> tuple[str, tuple[str, ...]] | None:
    """(backend, models) of an announcement; None for this replica's own, or anything malformed (logged)."""
    try:
        body = orjson.loads(data)
        backend, replica, models = body["backend"], body["replica"], body["models"]
        if not (isinstance(backend, str) and isinstance(replica, str) and isinstance(models, list)
                and all(isinstance(model, str) for model in models)):
            raise TypeError("fields of the wrong type")
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        log.warning("shared GPU ledger: ignored a malformed announcement on the channel (%s)", exc)
        return None
    return None if replica == skip_replica else (backend, tuple(models))


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
