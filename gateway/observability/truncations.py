"""Silent truncations seen in replies: counts per backend and model, and the last few events, for the status page.

The metric ``kvgate_truncations_total{backend,model}`` counts the same events. Its ``model`` label must stay
bounded whatever clients send, so it is the name the backend lists (see :func:`model_label`), never the client's
string as such.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from gateway.backends.model_names import name_candidates
from gateway.support.safe_text import safe_text

RECENT_EVENTS = 20
OTHER_MODEL = "other"
"""The label of a model name the backend does not list (a made-up name a llama-server answered anyway)."""


def model_label(listed_models: Iterable[str], requested: str | None) -> str:
    """The backend's own spelling of ``requested``; its only model when it lists one (llama-server serves one model
    whatever ``model`` says); otherwise :data:`OTHER_MODEL`. Bounded by the backend's model list."""
    listed = frozenset(listed_models)
    if requested:
        for name in name_candidates(requested):
            if name in listed:
                return name
    if len(listed) == 1:
        return next(iter(listed))
    return OTHER_MODEL


@dataclass(frozen=True, slots=True)
class TruncationEvent:
    at: str  # UTC, ISO 8601
    request_id: str
    backend: str
    model: str
    counted_tokens: int
    reported_tokens: int
    counter: str


class TruncationLog:
    """Per (backend, model) counts since start and the last :data:`RECENT_EVENTS` events, newest first."""

    def __init__(self, keep: int = RECENT_EVENTS, wall_clock: Callable[[], float] = time.time) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._recent: deque[TruncationEvent] = deque(maxlen=keep)
        self._wall_clock = wall_clock

    def add(
        self, *, request_id: str, backend: str, model: str, counted_tokens: int, reported_tokens: int, counter: str
    ) -> TruncationEvent:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._wall_clock()))
        request_id, backend, model = safe_text(request_id), safe_text(backend), safe_text(model)  # the status page
        event = TruncationEvent(stamp, request_id, backend, model, counted_tokens, reported_tokens, counter)
        key = (backend, model)
        self._counts[key] = self._counts.get(key, 0) + 1
        self._recent.appendleft(event)
        return event

    def total(self) -> int:
        return sum(self._counts.values())

    def snapshot(self) -> dict[str, Any]:
        return {
            "counts": [{"backend": b, "model": m, "truncations": n} for (b, m), n in sorted(self._counts.items())],
            "recent": [asdict(event) for event in self._recent],
        }
