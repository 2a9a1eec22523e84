"""A hang-up that arrives while kvgate starts is kept for later, not fatal.

SIGHUP's default action ends the process. ``kvgate serve`` reloads on it, but its handler can only be set once the
event loop runs, and before that come its imports (pydantic, aiohttp, the tokenizers: ~0.3 s, more on a busy host):
a SIGHUP in that window (a config-management tool's reload right after a restart, a closed terminal) used to kill
it. So the entry points (``kvgate``, ``python -m gateway``) run :func:`main`, which sets a handler that only
records the hang-up before importing anything else; ``kvgate serve`` takes it (:func:`take_pending`) once its
reload machinery is in place and reloads then. Every other command gives SIGHUP back its default (:func:`release`),
re-raising one that came meanwhile, so ``kvgate check`` still ends when its terminal closes.

Stdlib only, and nothing imported from kvgate at module level: this runs before the rest is loaded.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

_state = {"installed": False, "pending": False}


def _record(signum: int, frame: FrameType | None) -> None:
    _state["pending"] = True


def install() -> None:
    """Record SIGHUP instead of dying of it (where the platform has one; the main thread only)."""
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _record)
        _state["installed"] = True


def take_pending() -> bool:
    """Whether a hang-up came since :func:`install`; it is taken (a second call says False)."""
    pending, _state["pending"] = _state["pending"], False
    return pending


def release() -> None:
    """SIGHUP back to its default action, and a hang-up recorded meanwhile delivered now (a no-op unless
    :func:`install` ran)."""
    if not _state["installed"]:
        return
    _state["installed"] = False
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if take_pending():
        os.kill(os.getpid(), signal.SIGHUP)


def main() -> int:
    """The ``kvgate`` command: the hang-up handler first, then the command line (gateway/cli/main.py)."""
    install()
    from gateway.cli.main import main as cli_main

    return cli_main()
