"""``server.watch_config_s``: kvgate serve reloads when one of its ``--config`` files changes, as on SIGHUP.

Kubernetes updates a mounted ConfigMap or Secret in place (an atomic swap of the ``..data`` symlink, a minute or so
after the change) and tells nobody; a process that doesn't watch keeps running on the old settings until it is
restarted. So every ``watch_config_s`` kvgate reads its files (through their symlinks) and, when one's content
differs from the last read, asks for the same reload SIGHUP asks for: validated, guarded (gateway/config/
reload_guard.py), logged, and refused without a change when invalid. A file that can't be read at that moment (a
swap half-way) is read again next time; nothing is reloaded meanwhile. Reading is off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from gateway.config.files import fingerprint


async def watch_files(paths: Sequence[Path], interval_s: float, changed: Callable[[], None], *,
                      sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Until cancelled: call ``changed()`` once per change of the files' contents, checked every ``interval_s``."""
    last = await asyncio.to_thread(fingerprint, paths)
    while True:
        await sleep(interval_s)
        now = await asyncio.to_thread(fingerprint, paths)
        if now is None:
            continue  # one of them is missing right now: compare again next time
        if last is not None and now != last:
            changed()
        last = now
