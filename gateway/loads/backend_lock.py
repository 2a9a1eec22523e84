"""The lock a backend's residency is decided under: this replica's, and with a shared ledger every replica's.

``LoadGate`` decides, unloads and loads on a backend under it, and an unload a client asked for is forwarded under
it; the pool directory reads what is loaded under its local part (``local``: never in the middle of this replica's
unload). In process it is an
``asyncio.Lock``; with ``[shared_ledger]`` the holder also holds the backend's lease in Redis (``shared_gpu``), taken
after the local lock, so a replica's own requests queue in process and only one of them waits on Redis.

Redis unreachable as the lease is asked for: ``shared_ledger.on_unreachable = "refuse"`` answers 503
``ledger_unavailable`` (``GpuLedgerUnavailable``); ``"local_share"`` goes on under the local lock alone, said once
per outage in a WARNING, since replicas may then decide loads on the same GPU at once again.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Literal

from gateway.errors import GpuLedgerUnavailable
from gateway.loads.shared_gpu import GpuLedgerUnreachable, Held, SharedGpu

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1.0


class BackendLock:
    """``async with`` it: held by one task of this replica, and (shared) by one replica, at a time."""

    def __init__(self, backend: str, shared: SharedGpu | None = None,
                 on_unreachable: Literal["refuse", "local_share"] = "refuse") -> None:
        self._backend = backend
        self._local = asyncio.Lock()
        self._shared = shared
        self._on_unreachable = on_unreachable
        self._alone = False  # deciding alone while Redis is away (local_share): said once per outage
        self.held: Held | None = None
        """The shared lease while this replica holds it (None: no shared ledger, or deciding alone)."""

    def locked(self) -> bool:
        return self._local.locked()

    @property
    def local(self) -> asyncio.Lock:
        """This replica's part alone: enough for a read of what is loaded (never in the middle of this replica's
        own unload); another replica's unload is announced, and the models it names are read anew (shared_gpu.py),
        so a read never waits on Redis, nor on a load another replica has in flight."""
        return self._local

    async def __aenter__(self) -> BackendLock:
        await self._local.acquire()
        if self._shared is None:
            return self
        try:
            self.held = await self._shared.hold(self._backend)
        except GpuLedgerUnreachable as exc:
            if self._on_unreachable == "local_share":
                if not self._alone:
                    self._alone = True
                    log.warning("shared GPU ledger unreachable (%s): loads on backend '%s' are decided by this "
                                "replica alone until Redis answers (shared_ledger.on_unreachable = local_share)",
                                exc, self._backend)
                return self
            self._local.release()
            raise GpuLedgerUnavailable(
                f"kvgate can't decide a model load on backend '{self._backend}' now: the shared GPU ledger (Redis, "
                f"shared_ledger.redis_url) is unreachable ({exc}), and shared_ledger.on_unreachable = \"refuse\"; "
                "retry shortly", retry_after_s=RETRY_AFTER_S) from None
        except BaseException:
            self._local.release()
            raise
        if self._alone:
            self._alone = False
            log.warning("shared GPU ledger reachable again: loads on backend '%s' are decided one replica at a time "
                        "again", self._backend)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        held, self.held = self.held, None
        try:
            if held is not None:  # given back even when the holder's task is cancelled meanwhile
                await asyncio.shield(held.release())
        finally:
            self._local.release()
