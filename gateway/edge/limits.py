"""Each client's share of the edge, decided: pure functions ``gateway.edge.serving`` asks (no I/O, no clock), and the
limits they apply (``ClientLimits``, built once at start from ``server.*`` and RLIMIT_NOFILE).

    a body's rate     bytes received / time since its headers; after ``server.body_grace_s``, under
                      ``server.min_body_bytes_per_s``: 408 (a body read whole) or closed (one streamed through)
    at the cap        close, in order: a connection over its peer's limit, the one longest waiting for headers,
                      the longest idle, the slowest body; none of these: 503
    one peer          at most ``server.max_connections_per_peer`` connections from one address (default half the
                      cap); one more gets 429 in its route's dialect, then is closed
    descriptors       a connection accepted with a descriptor within ``FD_RESERVE`` of RLIMIT_NOFILE is answered 503
                      and closed: what is left is the upstream pool's (each proxied request holds a second one)
"""

from __future__ import annotations

import resource
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from gateway.config.settings import ServerSettings

T = TypeVar("T")

FD_RESERVE = 64
"""Descriptors kept free for upstream connections, the event loop, logs and tokenizer files: a connection accepted
above ``RLIMIT_NOFILE - FD_RESERVE`` is answered 503 rather than leaving the next accept to fail (no answer)."""


def body_too_slow(*, received_bytes: int, elapsed_s: float, min_bytes_per_s: float, grace_s: float) -> bool:
    """Whether a body has arrived slower than ``min_bytes_per_s`` on average, past its grace period."""
    if min_bytes_per_s <= 0 or elapsed_s < grace_s:
        return False
    return received_bytes < min_bytes_per_s * elapsed_s


def slowest(bodies: Iterable[tuple[T, int, float]]) -> T | None:
    """Of ``(connection, received_bytes, elapsed_s)``, the one with the lowest average rate (the longest-running
    among equals); None for none."""
    best: T | None = None
    best_key: tuple[float, float] | None = None
    for connection, received_bytes, elapsed_s in bodies:
        key = (received_bytes / max(elapsed_s, 1e-3), -elapsed_s)
        if best_key is None or key < best_key:
            best, best_key = connection, key
    return best


def per_peer_limit(configured: int | None, max_connections: int) -> int:
    """``server.max_connections_per_peer``, or half the connection cap when unset."""
    return configured if configured is not None else max(1, max_connections // 2)


def near_fd_limit(fd: int, soft_limit: int, reserve: int = FD_RESERVE) -> bool:
    """Whether a socket accepted as descriptor ``fd`` leaves fewer than ``reserve`` descriptors (descriptors are
    allocated lowest first, so ``fd`` + 1 are in use at least). ``soft_limit`` < 0: no limit."""
    return soft_limit >= 0 and fd >= soft_limit - reserve


@dataclass(frozen=True, slots=True)
class ClientLimits:
    header_timeout_s: float
    body_timeout_s: float
    client_write_timeout_s: float
    keepalive_timeout_s: float
    max_connections: int
    min_body_bytes_per_s: float = 0.0
    body_grace_s: float = 10.0
    max_connections_per_peer: int = 1_000_000
    fd_soft_limit: int = -1
    """RLIMIT_NOFILE's soft limit at start, -1 for none."""

    @classmethod
    def from_settings(cls, server: ServerSettings) -> ClientLimits:
        cap = server.max_connections if server.max_connections is not None else default_max_connections()
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return cls(server.header_timeout_s, server.body_timeout_s, server.client_write_timeout_s,
                   server.keepalive_timeout_s, cap, server.min_body_bytes_per_s, server.body_grace_s,
                   per_peer_limit(server.max_connections_per_peer, cap),
                   -1 if soft == resource.RLIM_INFINITY else int(soft))


def default_max_connections() -> int:
    """Half the open-file limit left after ``FD_RESERVE``: every proxied request holds two descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1_000_000
    return max(16, (soft - FD_RESERVE) // 2)
