"""Summarize a chat's oldest turns instead of dropping them, so the model keeps what they said (issue 13).

```
 before  system | user assistant | user assistant(call) tool | system | user assistant | user assistant | user
 turns   kept   | turn 1         | turn 2                    | kept   | turn 3         | turn 4         | newest
                                   ^ boundary                           ^ boundary       ^ largest boundary
                                   (keep_newest_turns=2: turn 4 and the newest stay verbatim)
 after   system | summary of turns 1-3 | system | user assistant | user
         kept   | one message          | kept   | turn 4         | newest
```
Boundaries are the turn cuts of ``trim.turn_cuts`` that leave at least ``keep_newest_turns`` newest turns verbatim,
so a tool call and its result are always replaced or kept together. Replacing at a boundary takes every message
before it except the system and developer messages, which stay in place; ONE summary message (``summary_role``,
content ``SUMMARY_PREFIX`` + text) stands where the first replaced message was. A history rebuilt from the same
summary is the same every time, so the backend's prompt cache keeps its prefix from one request to the next.

Cost is the point. A summary is a model call, so summaries are cached by the exact messages they replace
(``summary_key``: model, instructions and those messages) and reused:

1. Reuse: boundaries from the largest down, each probed in the cache; the first whose cached summary makes the
   prompt fit ``target_tokens`` is used, with no call.
2. Otherwise ONE new summary at the LARGEST boundary: the most turns replaced, the most room left for the turns
   still to come. Its input is incremental where it can be: the largest cached summary below that boundary (as one
   user message, ``SUMMARY_PREFIX`` + text) and then only the messages replaced since; else every replaced message.

A conversation growing a turn at a time thus costs one call each time it crosses the target, not one per turn:

```
 turn      1 .. 7      8      9 .. 12     13     14 .. 17    18 ...
 prompt    fits        new    cached      new    cached      new        (each "new" summarizes the previous
 calls     0           1      1           2      2           3           summary plus the turns since)
```
A summary that is made but does not fit is still cached, so the next request with the same history fails at once
(``SummaryFailed``) instead of paying for the same call again. The caller then falls back (trimming, or refusing).
Pure: no I/O, clock or logging; the counter, the summarizer and the cache are the caller's.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.fitting.trim import KEPT_ROLES, turn_cuts

Message = dict[str, Any]
CountFn = Callable[[list[Message]], Awaitable[int]]
"""Counts the prompt of a request whose ``messages`` are the given list (template included)."""
SummarizeFn = Callable[[list[Message]], Awaitable[str]]
"""Asks the summary model to summarize the given messages; returns the summary's text."""
KeyFn = Callable[[Sequence[Message]], str]
"""The cache key of a list of replaced messages (``summary_key`` with the model and instructions bound)."""

SUMMARY_PREFIX = "Summary of the earlier conversation, made by kvgate: "


SUMMARY_TIMEOUT = "timeout"
"""The summary model took longer than ``summary_timeout_s``."""
SUMMARY_ERROR = "error"
"""The summary request failed: refused (but not for its length), an error answer, a broken connection, an empty
summary, or no summary model to ask."""
SUMMARY_TOO_LONG = "too_long"
"""What was to be summarized is too long for the summary model's own context (its request was refused so)."""
SUMMARY_NO_FIT = "no_fit"
"""No summary makes the prompt fit: the summary (new or cached) leaves it over the target, or no turn may be
summarized (the newest ``keep_newest_turns`` turns stay verbatim)."""
SUMMARY_FAILURES = (SUMMARY_TIMEOUT, SUMMARY_ERROR, SUMMARY_TOO_LONG, SUMMARY_NO_FIT)


class SummaryFailed(Exception):
    """Raised when the summarizer failed, or its summary does not fit; str() says why, ``reason`` is one of
    ``SUMMARY_FAILURES`` (a bounded label for metrics)."""

    def __init__(self, message: str, reason: str = SUMMARY_ERROR) -> None:
        super().__init__(message)
        self.reason = reason


class SummaryCache:
    """Summaries by key, least recently used evicted first beyond ``max_entries`` (0 stores nothing).

    Single-threaded: the event loop's one thread is its only user.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, not {max_entries}")
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._texts: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        text = self._texts.get(key)
        if text is None:
            self.misses += 1
            return None
        self.hits += 1
        self._texts.move_to_end(key)
        return text

    def put(self, key: str, text: str) -> None:
        self._texts[key] = text
        self._texts.move_to_end(key)
        while len(self._texts) > self.max_entries:
            self._texts.popitem(last=False)

    def __len__(self) -> int:
        return len(self._texts)


def summary_key(model: str, instructions: str, replaced: Sequence[Message]) -> str:
    """The sha256 (hex) of the canonical JSON of what a summary depends on: the model that writes it, the
    instructions it is given and the messages it replaces."""
    canonical = orjson.dumps([model, instructions, list(replaced)], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True, slots=True)
class Summarized:
    messages: list[Message]
    replaced: int
    prompt_tokens: int
    cached: bool

    def describe(self, total: int, before_tokens: int) -> str:
        """What the summary did, in words (the X-Kvgate-Summarized header)."""
        text = (f"replaced the {self.replaced} oldest of {total} messages with a summary; "
                f"prompt {before_tokens:,} -> {self.prompt_tokens:,} tokens")
        return text + "; cached" if self.cached else text


@dataclass(frozen=True, slots=True)
class _Boundary:
    cut: int  # the index of the first message kept verbatim
    replaced: list[Message]  # every message before ``cut`` but the kept roles


def summary_message(text: str, role: str) -> Message:
    return {"role": role, "content": SUMMARY_PREFIX + text}


def _boundaries(messages: Sequence[Message], keep_newest_turns: int) -> list[_Boundary]:
    """The boundaries leaving at least ``keep_newest_turns`` turns verbatim, smallest first."""
    cuts = turn_cuts(messages)  # cuts[j] opens the (j + 2)th turn; len(cuts) - j turns start at or after it
    usable = cuts[:max(0, len(cuts) - keep_newest_turns + 1)]
    return [_Boundary(cut, [m for m in messages[:cut] if m.get("role") not in KEPT_ROLES]) for cut in usable]


def _with_summary(messages: Sequence[Message], cut: int, summary: Message) -> list[Message]:
    """The kept roles before ``cut`` in place, ``summary`` where the first replaced message was, then the rest."""
    first = next(i for i, m in enumerate(messages) if m.get("role") not in KEPT_ROLES)
    before = [m for m in messages[:cut] if m.get("role") in KEPT_ROLES]
    return [*before[:first], summary, *before[first:], *messages[cut:]]


async def _call(summarize: SummarizeFn, source: list[Message]) -> str:
    """The summarizer's text; whatever it raises, or an empty summary, becomes ``SummaryFailed``."""
    try:
        text = await summarize(source)
    except SummaryFailed:
        raise  # already says why
    except Exception as error:
        raise SummaryFailed(f"the summarizer failed: {type(error).__name__}: {error}") from error
    if not text.strip():
        raise SummaryFailed("the summarizer returned an empty summary")
    return text


def _summary_input(largest: _Boundary, previous: tuple[_Boundary, str] | None) -> list[Message]:
    """What to summarize at ``largest``: the previous summary and the messages since, or every replaced one."""
    if previous is None:
        return list(largest.replaced)
    boundary, text = previous
    return [summary_message(text, "user"), *largest.replaced[len(boundary.replaced):]]


def _too_long(what: str, result: Summarized, target_tokens: int) -> SummaryFailed:
    return SummaryFailed(f"{what} of the {result.replaced} oldest messages does not fit: "
                         f"{result.prompt_tokens:,} tokens > {target_tokens:,} target", SUMMARY_NO_FIT)


@dataclass(frozen=True, slots=True)
class SummaryGoal:
    """What a summarized history must be: at most ``target_tokens``, with its ``keep_newest_turns`` newest turns
    verbatim, the summary in a message of ``summary_role``."""

    keep_newest_turns: int
    target_tokens: int
    summary_role: str = "system"


async def summarize_history(
    messages: Sequence[Message], goal: SummaryGoal, *, count: CountFn, summarize: SummarizeFn, cache: SummaryCache,
    key_for: KeyFn,
) -> Summarized | None:
    """The history with its oldest turns replaced by one summary, counting at most the goal's ``target_tokens``.

    None when no boundary leaves ``keep_newest_turns`` (>= 1) turns verbatim. Raises ``SummaryFailed`` when the
    summarizer fails or its summary does not fit (see the module docstring for the order things are tried in).
    """
    keep_newest_turns, target_tokens, summary_role = goal.keep_newest_turns, goal.target_tokens, goal.summary_role
    if keep_newest_turns < 1:
        raise ValueError(f"keep_newest_turns must be >= 1, not {keep_newest_turns}")
    boundaries = _boundaries(messages, keep_newest_turns)
    if not boundaries:
        return None

    async def build(boundary: _Boundary, text: str, cached: bool) -> Summarized:
        history = _with_summary(messages, boundary.cut, summary_message(text, summary_role))
        return Summarized(history, len(boundary.replaced), await count(history), cached)

    largest, largest_key = boundaries[-1], key_for(boundaries[-1].replaced)
    hits: list[tuple[_Boundary, str, Summarized]] = []  # cached summaries too long, largest boundary first
    for boundary in reversed(boundaries):
        if (text := cache.get(largest_key if boundary is largest else key_for(boundary.replaced))) is None:
            continue
        result = await build(boundary, text, cached=True)
        if result.prompt_tokens <= target_tokens:
            return result
        hits.append((boundary, text, result))
    if hits and hits[0][0] is largest:  # the same call again would most likely give the same summary
        raise _too_long("the cached summary", hits[0][2], target_tokens)
    text = await _call(summarize, _summary_input(largest, hits[0][:2] if hits else None))
    cache.put(largest_key, text)
    result = await build(largest, text, cached=False)
    if result.prompt_tokens > target_tokens:
        raise _too_long("the summary", result, target_tokens)
    return result
