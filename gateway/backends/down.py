"""A refused connection to a backend that is down, not restarting: the 502 answered at once (liveness.py)."""

from __future__ import annotations

from gateway.backends.client import BackendUnreachable
from gateway.backends.registry import Backend
from gateway.errors import BackendDown


def down_error(backend: Backend, error: BaseException, window_s: float) -> BackendDown | None:
    """A 502 for a call whose connection was refused (``error`` or one of its causes) by a backend that has not
    answered within ``window_s`` (``admission.probe_wait_s``): waiting would only hold the client. None for any
    other failure, and for a backend up within that time (a restart, waited for)."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, BackendUnreachable):
        cause = cause.__cause__
    if not isinstance(cause, BackendUnreachable) or backend.client.liveness.up(window_s):
        return None
    return BackendDown(f"{cause.message}; {backend.client.liveness.describe()}, so it is down, not restarting: "
                       f"kvgate answers at once (it waits up to {window_s:g} s, admission.probe_wait_s, only for a "
                       "backend that answered within that time); start it, or check its url")
