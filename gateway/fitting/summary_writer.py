"""Writing a summary: kvgate asks the summary model through itself, so the request is admitted like any other.

The summary request is an OpenAI-style ``POST /v1/chat/completions`` (not streamed, ``max_tokens`` = the policy's
output budget) sent to kvgate's own address: it is counted, reserved in the summary model's pool and queued there,
routed to ``summary_backend`` when the policy names one, and answered or refused like a client's request. A
per-process secret in ``X-Kvgate-Internal`` marks it, so that

    - it runs as the tenant ``kvgate-summarizer`` (no API key needed, whatever ``require_api_key`` says),
    - it is never summarized itself (its policy has no "summarize"),
    - ``X-Kvgate-Route-Backend`` is honoured (a client's is ignored),

and neither header ever reaches a backend. The call has its own time limit (``summary_timeout_s``); every failure
(a refusal, an error answer, a timeout, an empty summary) is a ``SummaryFailed`` naming why, and the request that
wanted the summary is trimmed instead.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from gateway.fitting.policy import FitPolicy
from gateway.fitting.summary_fit import SUMMARY_ERROR, SUMMARY_TIMEOUT, SUMMARY_TOO_LONG, Message, SummaryFailed
from gateway.tokens.countable_text import content_text

INTERNAL_HEADER = "X-Kvgate-Internal"
ROUTE_BACKEND_HEADER = "X-Kvgate-Route-Backend"
SUMMARIZER_TENANT = "kvgate-summarizer"
TRANSCRIPT_HEADING = "The conversation to summarize:"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""The code of kvgate's (and OpenAI's) refusal of a prompt too long for the context: the summary model's context
can't hold the conversation to summarize."""


class InternalCalls:
    """kvgate's requests to itself: its own address (set once it listens) and the secret that marks them."""

    def __init__(self) -> None:
        self.token = secrets.token_urlsafe(32)
        self.url: str | None = None

    def __repr__(self) -> str:
        return f"InternalCalls(url={self.url!r})"  # never the token

    def is_internal(self, headers: Mapping[str, str]) -> bool:
        given = headers.get(INTERNAL_HEADER)
        return given is not None and hmac.compare_digest(given.encode(errors="replace"), self.token.encode())


def transcript(messages: Sequence[Message]) -> str:
    """The messages as plain text for the summarizer: one block per message, tool calls and results named."""
    blocks = []
    for message in messages:
        role = str(message.get("role") or "unknown")
        text = content_text(message.get("content"))
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            named = [json.dumps(call.get("function", call), ensure_ascii=False) for call in calls
                     if isinstance(call, dict)]
            text = (text + "\n" if text else "") + "tool calls: " + "; ".join(named)
        blocks.append(f"{role}: {text}")
    return TRANSCRIPT_HEADING + "\n\n" + "\n\n".join(blocks)


class Summarizer:
    def __init__(self, session: aiohttp.ClientSession, internal: InternalCalls) -> None:
        self._session = session
        self._internal = internal
        self.calls = 0

    async def summarize(self, messages: Sequence[Message], policy: FitPolicy) -> str:
        """The summary of ``messages`` by the policy's summary model; SummaryFailed naming why there is none (its
        failures are counted by ``Summaries``, with those of summaries that do not fit)."""
        self.calls += 1
        return await self._ask(messages, policy)

    async def _ask(self, messages: Sequence[Message], policy: FitPolicy) -> str:
        if self._internal.url is None or policy.summary_model is None:
            raise SummaryFailed("no summary model is configured, or kvgate is not listening yet")
        body = {
            "model": policy.summary_model, "stream": False, "max_tokens": policy.summary_max_tokens,
            "messages": [{"role": "system", "content": policy.summary_instructions},
                         {"role": "user", "content": transcript(messages)}],
        }
        headers = {INTERNAL_HEADER: self._internal.token, "Accept-Encoding": "identity"}  # read as JSON here
        if policy.summary_backend:
            headers[ROUTE_BACKEND_HEADER] = policy.summary_backend
        url = f"{self._internal.url}/v1/chat/completions"
        try:
            async with asyncio.timeout(policy.summary_timeout_s):
                async with self._session.post(url, json=body, headers=headers) as response:
                    raw = await response.read()
                    status = response.status
        except TimeoutError:
            raise SummaryFailed(f"the summary model {policy.summary_model!r} took longer than "
                                f"{policy.summary_timeout_s:g} s (summary_timeout_s)", SUMMARY_TIMEOUT) from None
        except aiohttp.ClientError as exc:
            raise SummaryFailed(f"the summary request failed: {exc}") from None
        return _summary_text(raw, status, policy.summary_model)


def _summary_text(raw: bytes, status: int, model: str) -> str:
    try:
        data: Any = orjson.loads(raw)
    except ValueError:
        data = None
    if status != 200:
        error = data.get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        code = error.get("code") if isinstance(error, dict) else None
        raise SummaryFailed(f"the summary model {model!r} answered {status}: {str(message or raw[:200])[:300]}",
                            SUMMARY_TOO_LONG if code == CONTEXT_LENGTH_EXCEEDED else SUMMARY_ERROR)
    try:
        text = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise SummaryFailed(f"the summary model {model!r} answered without a message") from None
    if not isinstance(text, str) or not text.strip():
        raise SummaryFailed(f"the summary model {model!r} wrote an empty summary")
    return text.strip()
