"""Trim a chat's oldest history until its prompt fits the model's context, keeping the turns well-formed.

```
 system | user assistant tool | system | user assistant(call) user(tool_result) | user
 kept   | turn 1              | kept   | turn 2                                 | newest turn, kept
                                       ^ cut: drop 1 turn                       ^ cut: drop 2 turns
```
A turn is a user message and everything up to the next one: the assistant's replies, its tool calls and their
results (a user message that carries Anthropic ``tool_result`` blocks answers a call; it does not open a turn).
Messages before the first user message form a turn of their own. Trimming drops whole turns, oldest first, so the
kept history opens with a user message and alternates wherever the original did (Gemma's and Mistral's templates
refuse anything else). A cut is never placed between a tool call and a result answering it, so the two are kept or
dropped together even when the client put a user message between them. Always kept: system and developer messages,
in place, and the newest turn (the new user message, or the tool result the model must answer, with its call).

The number of dropped turns is found by bisection, since the prompt shrinks as more is dropped; with per-message
counts cached by the caller, each recount costs only the changed messages. The client is told in the
X-Kvgate-Trimmed header; nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

KEPT_ROLES = frozenset({"system", "developer"})

Message = dict[str, Any]
CountFn = Callable[[list[Message]], Awaitable[int]]
"""Counts the prompt of a request whose ``messages`` are the given list (template included)."""


@dataclass(frozen=True, slots=True)
class Trimmed:
    messages: list[Message]
    dropped: int
    prompt_tokens: int

    def describe(self, total: int, before_tokens: int) -> str:
        return describe_trim(self.dropped, total, before_tokens, self.prompt_tokens)


def describe_trim(dropped: int, total: int, before_tokens: int, after_tokens: int) -> str:
    """What a trim did, in words (the X-Kvgate-Trimmed header)."""
    return f"dropped the {dropped} oldest of {total} messages; prompt {before_tokens:,} -> {after_tokens:,} tokens"


def _blocks(message: Message, kind: str) -> list[dict[str, Any]]:
    """The Anthropic content blocks of one type (``tool_use``, ``tool_result``)."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict) and block.get("type") == kind]


def _call_ids(message: Message) -> list[str] | None:
    """The ids of the tool calls a message makes ([] when they carry none, as Ollama's); None if it calls nothing."""
    calls = [call for call in message.get("tool_calls") or () if isinstance(call, dict)]
    uses = _blocks(message, "tool_use")
    if not calls and not uses and not message.get("function_call"):
        return None
    return [ref for ref in (*(c.get("id") for c in calls), *(u.get("id") for u in uses)) if isinstance(ref, str)]


def _result_refs(message: Message) -> list[str | None]:
    """One entry per tool result a message carries: the id of the call it answers, None when it names none."""
    role = message.get("role")
    if role in ("tool", "function"):
        ref = message.get("tool_call_id")
        return [ref if isinstance(ref, str) else None]
    return [ref if isinstance(ref := block.get("tool_use_id"), str) else None
            for block in _blocks(message, "tool_result")]


def _opens_turn(message: Message) -> bool:
    return message.get("role") == "user" and not _blocks(message, "tool_result")


def _tool_pairs(messages: Sequence[Message]) -> Iterator[tuple[int, int]]:
    """(call index, result index) for every tool result whose call is in the history.

    A result names its call by id (OpenAI ``tool_call_id``, Anthropic ``tool_use_id``); one naming none (Ollama)
    answers the latest call before it. A result naming an id not in the history answers nothing here.
    """
    call_at: dict[str, int] = {}
    latest_call: int | None = None
    for index, message in enumerate(messages):
        for ref in _result_refs(message):
            call = latest_call if ref is None else call_at.get(ref)
            if call is not None:
                yield call, index
        ids = _call_ids(message)
        if ids is not None:
            latest_call = index
            call_at.update(dict.fromkeys(ids, index))


def turn_cuts(messages: Sequence[Message]) -> list[int]:
    """Where the kept history may begin, oldest first: dropping ``k`` turns keeps from ``cuts[k - 1]`` on.

    A cut is a message opening a turn, after the first turn, that no tool call before it still waits on.
    """
    first = next((i for i, m in enumerate(messages) if m.get("role") not in KEPT_ROLES), None)
    if first is None:
        return []
    spanning = [0] * (len(messages) + 1)  # difference array: how many call..result spans cover each index
    for call, result in _tool_pairs(messages):
        spanning[call + 1] += 1
        spanning[result + 1] -= 1
    cuts: list[int] = []
    covering = 0
    for index, message in enumerate(messages):
        covering += spanning[index]
        if index > first and covering == 0 and _opens_turn(message):
            cuts.append(index)
    return cuts


def kept_from(messages: Sequence[Message], cut: int, shape: Sequence[Message] | None = None) -> list[Message]:
    """The history from ``cut`` on, with the system and developer messages before it kept in place (roles read
    from ``shape``, a chat-shaped view of the same items, when given: the Responses API's input items)."""
    roles = messages if shape is None else shape
    return [m for i, m in enumerate(messages) if i >= cut or roles[i].get("role") in KEPT_ROLES]


async def trim_history(
    messages: Sequence[Message], count: CountFn, target_tokens: int, *, shape: Sequence[Message] | None = None
) -> Trimmed | None:
    """The trim dropping the fewest whole turns (at least one) whose prompt is at most ``target_tokens``; turns are
    found in ``shape`` when given (a chat-shaped view of ``messages``, item for item).

    None when nothing can be dropped, or when even dropping every turn but the newest is too long.
    """
    cuts = turn_cuts(messages if shape is None else shape)

    async def dropping(turns: int) -> Trimmed:
        kept = kept_from(messages, cuts[turns - 1], shape)
        return Trimmed(kept, len(messages) - len(kept), await count(kept))

    if not cuts:
        return None
    best = await dropping(len(cuts))
    if best.prompt_tokens > target_tokens:
        return None
    low, high = 1, len(cuts)  # invariant: dropping `high` turns fits, and `best` is that trim
    while low < high:
        middle = (low + high) // 2
        candidate = await dropping(middle)
        if candidate.prompt_tokens <= target_tokens:
            high, best = middle, candidate
        else:
            low = middle + 1
    return best
