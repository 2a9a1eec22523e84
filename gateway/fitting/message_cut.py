"""Fit a chat whose message alone is past the context: keep that message's head and tail around a marker (pure).

```
 messages  | system | user: "Summarize this conversation: ... 90,000 characters ... Write the summary." |
 kept      | system | user: "Summarize this ..." + "[... 84,000 characters omitted by kvgate ...]" + "... summary." |
```
The message cut is the one with the most text that is not a system or developer message (those, and the tools,
are the client's instructions: never cut; a chat whose instructions alone are past the context can't be fitted).
Its text is its ``content`` string, the text parts of a ``content`` list (``{"type": "text" | "input_text" |
"output_text", "text": ...}``: OpenAI, Anthropic, the Responses API) taken as one text, or a Responses
``function_call_output``'s ``output`` string. The kept head comes from the first parts and the tail from the last,
parts wholly inside the omitted middle are left out, and every other part (an image, a tool use) stays in place.

As for a prompt (head_tail.py), the number of characters kept on each side is the largest whose whole chat, marker
included, counts at most the target (``search.largest_fitting``, never past ``MAX_CHARS_PER_TOKEN`` a target token,
so a message of megabytes costs a handful of counts of the target's size); the result is one counted and fitting.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.fitting.head_tail import MAX_CHARS_PER_TOKEN, omission_marker
from gateway.fitting.search import largest_fitting

Message = dict[str, Any]
CountFn = Callable[[list[Message]], Awaitable[int]]
"""Counts the prompt of a request whose chat is the given list (template included)."""
INSTRUCTION_ROLES = frozenset({"system", "developer"})
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


@dataclass(frozen=True, slots=True)
class MessageCut:
    """The chat with one message's middle omitted: which message (its position in ``messages``), what was kept."""

    messages: list[Message]
    index: int
    role: str
    kept_chars: int
    omitted_chars: int
    prompt_tokens: int

    def describe(self) -> str:
        half_chars = self.kept_chars // 2
        return (f"kept the first {half_chars:,} and last {half_chars:,} characters of its text, "
                f"{self.omitted_chars:,} omitted")


def _text_parts(content: list[Any]) -> list[int]:
    return [i for i, part in enumerate(content) if isinstance(part, dict) and isinstance(part.get("text"), str)
            and part.get("type", "text") in TEXT_PART_TYPES]


def text_length(message: Message) -> int:
    """Characters of the message's text that a cut may shorten (0: none to cut)."""
    if not isinstance(message, dict) or message.get("role") in INSTRUCTION_ROLES:
        return 0
    content = message.get("content")
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(content[i]["text"]) for i in _text_parts(content))
    output = message.get("output")  # a Responses function_call_output
    return len(output) if message.get("type") == "function_call_output" and isinstance(output, str) else 0


def with_head_and_tail(message: Message, half_chars: int) -> Message:
    """A copy of ``message`` whose text keeps its first and last ``half_chars`` characters around the marker."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": _cut(content, half_chars)}
    if isinstance(content, list):
        return {**message, "content": _cut_parts(content, half_chars)}
    return {**message, "output": _cut(message["output"], half_chars)}


def _cut(text: str, half_chars: int) -> str:
    omitted = len(text) - 2 * half_chars
    return text[:half_chars] + omission_marker(omitted) + text[len(text) - half_chars:]


def _cut_parts(content: list[Any], half_chars: int) -> list[Any]:
    """The parts with their joined text cut: head from the first text parts, tail from the last, the marker where
    the head ends; text parts wholly in the omitted middle are left out, other parts kept in place."""
    texts = _text_parts(content)
    total = sum(len(content[i]["text"]) for i in texts)
    tail_from = total - half_chars
    marker = omission_marker(total - 2 * half_chars)
    out: list[Any] = []
    start = 0
    marked = False
    for index, part in enumerate(content):
        if index not in texts:
            out.append(part)
            continue
        text: str = part["text"]
        end = start + len(text)
        head = text[:max(0, min(len(text), half_chars - start))]
        tail = text[max(0, tail_from - start):] if end > tail_from else ""
        piece = head
        if not marked and end > half_chars:  # the head ends in this part (or at its start)
            piece, marked = piece + marker, True
        piece += tail
        if piece:
            out.append({**part, "text": piece})
        start = end
    return out


async def cut_longest_message(
    messages: Sequence[Message], count: CountFn, target_tokens: int
) -> MessageCut | None:
    """The chat with its longest non-instruction message cut to the most characters whose prompt counts at most
    ``target_tokens``; None when there is none to cut or even the marker alone does not fit."""
    lengths = [text_length(m) for m in messages]
    if not lengths or max(lengths) < 2:
        return None
    index = max(range(len(messages)), key=lambda i: lengths[i])
    total = lengths[index]
    role = str(messages[index].get("role") or messages[index].get("type") or "message")

    async def keeping(half_chars: int) -> MessageCut:
        changed = list(messages)
        changed[index] = with_head_and_tail(messages[index], half_chars)
        return MessageCut(changed, index, role, 2 * half_chars, total - 2 * half_chars, await count(changed))

    high = min((total - 1) // 2, max(0, target_tokens) * MAX_CHARS_PER_TOKEN)
    return await largest_fitting(high, keeping, lambda cut: cut.prompt_tokens, target_tokens)
