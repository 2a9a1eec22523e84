"""Trim a chat's oldest history until its prompt fits the model's context, keeping what matters most.

Always kept: system (and developer) messages, and the last message. Dropped, oldest first: everything else, a turn
at a time (a tool result is never kept without the message that called the tool). The number of dropped messages
is found by bisection, since the prompt shrinks as more is dropped; with per-message counts cached, each recount
costs only the changed messages. The client is told in the X-Kvgate-Trimmed header; nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

KEPT_ROLES = frozenset({"system", "developer"})

CountFn = Callable[[list[dict[str, Any]]], Awaitable[int]]
"""Counts the prompt of a request whose ``messages`` are the given list (template included)."""


@dataclass(frozen=True, slots=True)
class Trimmed:
    messages: list[dict[str, Any]]
    dropped: int
    prompt_tokens: int

    def describe(self, total: int, before_tokens: int) -> str:
        return (f"dropped the {self.dropped} oldest of {total} messages; prompt {before_tokens:,} -> "
                f"{self.prompt_tokens:,} tokens")


def _droppable(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Indices that may go, oldest first (not system/developer messages, not the last message)."""
    last = len(messages) - 1
    return [i for i, m in enumerate(messages) if i != last and m.get("role") not in KEPT_ROLES]


def _without(messages: Sequence[dict[str, Any]], droppable: list[int], n: int) -> list[dict[str, Any]]:
    gone = set(droppable[:n])
    kept = [m for i, m in enumerate(messages) if i not in gone]
    # a tool result whose call was dropped would confuse the template: drop it too
    first_kept = next((i for i, m in enumerate(kept) if m.get("role") not in KEPT_ROLES), None)
    while first_kept is not None and first_kept < len(kept) - 1 and kept[first_kept].get("role") == "tool":
        del kept[first_kept]
    return kept


async def trim_history(messages: Sequence[dict[str, Any]], count: CountFn, target_tokens: int) -> Trimmed | None:
    """The shortest trim whose prompt is at most ``target_tokens``; None when even the fullest trim is too long."""
    droppable = _droppable(messages)
    if not droppable:
        return None
    fullest = _without(messages, droppable, len(droppable))
    fullest_tokens = await count(fullest)
    if fullest_tokens > target_tokens:
        return None
    low, high = 1, len(droppable)  # invariant: dropping `high` fits
    best = Trimmed(fullest, len(messages) - len(fullest), fullest_tokens)
    while low < high:
        middle = (low + high) // 2
        candidate = _without(messages, droppable, middle)
        tokens = await count(candidate)
        if tokens <= target_tokens:
            high = middle
            best = Trimmed(candidate, len(messages) - len(candidate), tokens)
        else:
            low = middle + 1
    if best.dropped != len(messages) - len(_without(messages, droppable, high)):
        candidate = _without(messages, droppable, high)
        best = Trimmed(candidate, len(messages) - len(candidate), await count(candidate))
    return best
