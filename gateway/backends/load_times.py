"""How long model loads take on each backend: what routing weighs a load elsewhere against (gateway/routing/).

Every load kvgate asks an Ollama backend for (an empty /api/generate) is answered once the model is loaded, with the
backend's own ``load_duration`` (nanoseconds; kvsim reports it too), kept at most as long as the request took on
kvgate's clock (a load can't outlast the request that waited for it; a simulator running faster than real time
reports its own seconds); without one, kvgate's own timing of the request stands in.

The expected load of a model on a backend is the median of its last ``WINDOW`` loads there; before any, of the same
model's loads on the other backends (hosts serving one model are usually alike); else of any model's loads on that
backend; else unknown (the router then uses ``routing.default_load_s``). No I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from statistics import median

from gateway.backends.model_names import canonical_model

WINDOW = 8
NS_PER_S = 1e9


class LoadTimes:
    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], deque[float]] = {}

    def record(self, backend: str, model: str, seconds: float) -> None:
        if seconds >= 0:
            self._seen.setdefault((backend, canonical_model(model)), deque(maxlen=WINDOW)).append(seconds)

    def expected_s(self, backend: str, model: str) -> tuple[float, str] | None:
        """The expected load, and where it was learned ("here", "on <backend>", "of other models here"); None
        before any load was seen."""
        model = canonical_model(model)
        here = self._seen.get((backend, model))
        if here:
            return median(here), "here"
        elsewhere = {name: times for (name, other), times in self._seen.items() if other == model and times}
        if elsewhere:
            return median(t for times in elsewhere.values() for t in times), f"on {', '.join(sorted(elsewhere))}"
        others = [t for (name, _), times in self._seen.items() if name == backend for t in times]
        if others:
            return median(others), "of other models here"
        return None


def reported_load_s(answer: object) -> float | None:
    """An Ollama answer's ``load_duration`` in seconds (None when it has none)."""
    if not isinstance(answer, dict):
        return None
    value = answer.get("load_duration")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return value / NS_PER_S
