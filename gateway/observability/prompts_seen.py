"""The longest prompt kvgate has counted per backend and model since it started: what ``kvgate check --gateway``
compares each model's allocated context against (is the context too small for the prompts clients send, or far
larger than they need?)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_POOLS = 512
"""Model names come from clients: at most this many (backend, model) pairs are kept, the longest prompts first."""


@dataclass(slots=True)
class _Seen:
    tokens: int
    exact: bool
    requests: int


class LongestPrompts:
    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], _Seen] = {}

    def see(self, backend: str | None, model: str | None, tokens: int, exact: bool) -> None:
        if not backend or tokens <= 0:
            return
        key = (backend, model or "")
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= MAX_POOLS:
                shortest = min(self._seen, key=lambda k: self._seen[k].tokens)
                if self._seen[shortest].tokens >= tokens:
                    return
                del self._seen[shortest]
            self._seen[key] = _Seen(tokens, exact, 1)
            return
        seen.requests += 1
        if tokens > seen.tokens:
            seen.tokens, seen.exact = tokens, exact

    def snapshot(self) -> list[dict[str, Any]]:
        """Longest first, for ``/kvgate/status``."""
        rows = [{"backend": b, "model": m, "tokens": s.tokens, "exact": s.exact, "requests": s.requests}
                for (b, m), s in self._seen.items()]
        return sorted(rows, key=lambda row: -int(row["tokens"]))
