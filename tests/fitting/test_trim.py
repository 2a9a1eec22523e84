"""Trimming history: oldest turns first, system prompt and last message kept, the shortest trim that fits."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.fitting.trim import trim_history


def _chat(*roles: str) -> list[dict[str, Any]]:
    return [{"role": role, "content": f"{role}{i}"} for i, role in enumerate(roles)]


async def _ten_each(messages: list[dict[str, Any]]) -> int:
    return 10 * len(messages) + 3


@pytest.mark.parametrize(
    ("roles", "target", "kept"),
    [
        (("system", "user", "assistant", "user", "assistant", "user"), 43, ["system0", "user3", "assistant4", "user5"]),
        (("system", "user", "assistant", "user", "assistant", "user"), 23, ["system0", "user5"]),
        (("user", "assistant", "user"), 13, ["user2"]),
        (("system", "user", "assistant", "tool", "user"), 33, ["system0", "user4"]),
        (("system", "user", "assistant", "tool", "assistant", "user"), 43, ["system0", "assistant4", "user5"]),
    ],
)
async def test_shortest_trim_that_fits(roles: tuple[str, ...], target: int, kept: list[str]) -> None:
    messages = _chat(*roles)
    trimmed = await trim_history(messages, _ten_each, target)
    assert trimmed is not None
    assert [m["content"] for m in trimmed.messages] == kept
    assert trimmed.prompt_tokens <= target and trimmed.dropped == len(messages) - len(kept)


async def test_none_when_even_the_fullest_trim_is_too_long() -> None:
    assert await trim_history(_chat("system", "user", "user"), _ten_each, 22) is None
    assert await trim_history(_chat("user"), _ten_each, 5) is None


async def test_counts_are_few() -> None:
    calls = 0

    async def counting(messages: list[dict[str, Any]]) -> int:
        nonlocal calls
        calls += 1
        return 10 * len(messages)

    messages = _chat("system", *(["user", "assistant"] * 500), "user")
    trimmed = await trim_history(messages, counting, 5000)
    assert trimmed is not None and trimmed.prompt_tokens == 5000
    assert calls <= 12
