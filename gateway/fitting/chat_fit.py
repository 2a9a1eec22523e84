"""Trim a chat request so its prompt fits the context, on every chat route (the ``trim`` remedy; pure).

    where the turns are       the body's ``messages``: Ollama /api/chat, OpenAI /v1/chat/completions, Anthropic
                              /v1/messages (its ``system`` is a field of its own), llama-server /chat/completions;
                              the Responses API's ``input``: its items (turns found in their chat shape), or one
                              string (a single user message)
    1. drop whole turns       the oldest first, the fewest that make it fit (trim.py)
    2. cut one message        when even the newest turn alone is past the context: every older turn is dropped and
                              the middle of its longest message omitted around a marker (message_cut.py); system
                              and developer messages and the tools are never cut

Only that list changes; every other field of the body stays as sent. The result says what was done, for the
``X-Kvgate-Trimmed`` header: ``dropped the 2 oldest of 5 messages; cut message 5 of 5 (user): kept the first
1,200 and last 1,200 characters of its text, 88,000 omitted; prompt 31,020 -> 3,950 tokens``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.dialects.responses import chat_shape
from gateway.domain import Operation
from gateway.fitting.message_cut import MessageCut, cut_longest_message
from gateway.fitting.trim import KEPT_ROLES, Message, describe_trim, trim_history, turn_cuts

BodyCountFn = Callable[[dict[str, Any]], Awaitable[int]]
"""Counts the prompt of a request with the given body."""


@dataclass(frozen=True, slots=True)
class ChatTrim:
    """The trimmed body, the oldest messages dropped, and the message cut (``cut_position``: 1-based, in the
    client's list), if one was."""

    body: dict[str, Any]
    dropped: int
    of_messages: int
    prompt_tokens: int
    cut: MessageCut | None = None
    cut_position: int = 0

    def describe(self, before_tokens: int) -> str:
        if self.cut is None:
            return describe_trim(self.dropped, self.of_messages, before_tokens, self.prompt_tokens)
        said = [f"dropped the {self.dropped} oldest of {self.of_messages} messages"] if self.dropped else []
        said.append(f"cut message {self.cut_position} of {self.of_messages} ({self.cut.role}): {self.cut.describe()}")
        said.append(f"prompt {before_tokens:,} -> {self.prompt_tokens:,} tokens")
        return "; ".join(said)


@dataclass(frozen=True, slots=True)
class _Turns:
    """The list trimming works on: the body's own items, their chat shape, and how to write a shorter list back."""

    key: str
    items: list[Message]
    shape: list[Message] | None
    as_string: bool

    def body_with(self, body: dict[str, Any], items: list[Message]) -> dict[str, Any]:
        if self.as_string and len(items) == 1 and isinstance(items[0].get("content"), str):
            return {**body, self.key: items[0]["content"]}
        return {**body, self.key: items}


def _turns(operation: Operation, body: dict[str, Any]) -> _Turns | None:
    if operation is Operation.RESPONSES:
        given = body.get("input")
        if isinstance(given, str):
            return _Turns("input", [{"role": "user", "content": given}], None, True)
        if isinstance(given, list) and given:
            items = [item if isinstance(item, dict) else {} for item in given]
            return _Turns("input", items, [chat_shape(item) for item in items], False)
        return None
    messages = body.get("messages")
    if operation is Operation.CHAT and isinstance(messages, list) and messages:
        return _Turns("messages", [m if isinstance(m, dict) else {} for m in messages], None, False)
    return None


async def trim_chat(
    operation: Operation, body: dict[str, Any], count: BodyCountFn, target_tokens: int
) -> ChatTrim | None:
    """The body trimmed to a prompt of at most ``target_tokens`` (see the module docstring); None when the request
    is not a chat, or even its instructions and the marker alone don't fit."""
    turns = _turns(operation, body)
    if turns is None:
        return None
    items = turns.items

    async def count_items(changed: list[Message]) -> int:
        return await count(turns.body_with(body, changed))

    trimmed = await trim_history(items, count_items, target_tokens, shape=turns.shape)
    if trimmed is not None:
        return ChatTrim(turns.body_with(body, trimmed.messages), trimmed.dropped, len(items), trimmed.prompt_tokens)
    roles = turns.shape or items
    cuts = turn_cuts(roles)
    kept = [i for i in range(len(items)) if not cuts or i >= cuts[-1] or roles[i].get("role") in KEPT_ROLES]
    cut = await cut_longest_message([items[i] for i in kept], count_items, target_tokens)
    if cut is None:
        return None
    return ChatTrim(turns.body_with(body, cut.messages), len(items) - len(kept), len(items), cut.prompt_tokens, cut,
                    kept[cut.index] + 1)
