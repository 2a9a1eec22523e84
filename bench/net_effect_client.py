"""The net-effect benchmark's client: one request sent as a real client sends it, and its outcome classified.

Every reply is read whole (a stream to its end) and put in one class:

    completed    200 with a complete answer (a final ``done``, ``[DONE]``, ``finish_reason``, ``stop: true``, or a
                 whole JSON body); ``trimmed`` when kvgate announced it changed the history (X-Kvgate-Trimmed,
                 X-Kvgate-Summarized): a completed answer whose client was told
    failed       the backend failed it: a context error ("Context size has been exceeded.", llama-server's
                 ``exceed_context_size_error``, Ollama's "input length exceeds the context length"), an out of
                 memory, any other 5xx, an error inside a 200 stream, a stream without its final event, a connection
                 refused or dropped
    refused      a 4xx or 503 that is none of those: a clear refusal (kvgate's, or the backend's own 404)
    timed_out    no whole answer within the client's timeout

A prompt a backend truncated silently answers 200; the simulator counts every such cut (``/sim/stats``
``truncated_prompts``), and the run moves that many completed answers to ``truncated`` (``net_effect.py``).
All traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

Api = Literal["ollama", "openai", "llama", "embed"]
"""How a reply is read: Ollama's NDJSON and bodies, OpenAI's SSE and bodies, llama-server's native /completion
(SSE, or a body that may be an array for a batch), an embedding or rerank body."""
Status = Literal["completed", "trimmed", "failed", "refused", "timed_out"]

CONTEXT_ERRORS = (
    "context size has been exceeded",
    "exceed_context_size_error",
    "exceeds the available context size",
    "input length exceeds the context length",
    "prompt is longer than the context length",
)
OOM_ERRORS = ("out of memory", "cudamalloc failed", "failed to allocate")
ANNOUNCED = ("x-kvgate-trimmed", "x-kvgate-summarized")


@dataclass(frozen=True)
class Request:
    """One request as a client sends it: the route, the JSON body, and how its reply is read."""

    path: str
    body: dict[str, Any]
    api: Api
    stream: bool = False


@dataclass
class Result:
    """What one request got back."""

    status: Status
    latency_s: float
    http_status: int = 0
    tokens: int = 0
    """Generated tokens: the reply's own count (usage, eval_count, tokens_predicted), else its content chunks."""
    text: str = ""
    """The answer's text (a chat's next turn appends it to the history)."""
    error: str = ""
    failure: str = ""
    """For a failure: context, oom, 5xx, stream, connect."""
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("completed", "trimmed")


async def send(http: aiohttp.ClientSession, base_url: str, request: Request, timeout_s: float) -> Result:
    """Send ``request`` to ``base_url`` and classify what comes back (never raises for what a server does)."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with http.post(base_url + request.path, json=request.body) as response:
                headers = {k.lower(): v for k, v in response.headers.items() if k.lower().startswith("x-kvgate")}
                raw = await response.read()
                result = _classify(request, response.status, raw, headers)
    except TimeoutError:
        return Result("timed_out", time.perf_counter() - started, error=f"no whole answer within {timeout_s:g} s")
    except aiohttp.ClientError as exc:
        return Result("failed", time.perf_counter() - started, error=str(exc) or type(exc).__name__,
                      failure="connect")
    result.latency_s = time.perf_counter() - started
    return result


def _error_text(payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            return " ".join(str(error.get(key, "")) for key in ("type", "message")).strip()
        return str(error)
    return str(payload)


def _failure_kind(status: int, text: str) -> str | None:
    """context / oom / 5xx for a failed answer, None for a refusal."""
    lowered = text.lower()
    if any(marker in lowered for marker in CONTEXT_ERRORS):
        return "context"
    if any(marker in lowered for marker in OOM_ERRORS):
        return "oom"
    if status >= 500 and status != 503:
        return "5xx"
    return None


def _classify(request: Request, status: int, raw: bytes, headers: dict[str, str]) -> Result:
    if status != 200:
        try:
            text = _error_text(orjson.loads(raw))
        except orjson.JSONDecodeError:
            text = raw[:300].decode(errors="replace")
        kind = _failure_kind(status, text)
        return Result("failed" if kind else "refused", 0.0, status, error=text[:300], failure=kind or "",
                      headers=headers)
    read = _read_stream(request.api, raw) if request.stream else _read_body(request.api, raw)
    if read.error is not None:
        kind = _failure_kind(500, read.error) or "stream"
        return Result("failed", 0.0, status, read.tokens, read.text, read.error[:300], kind, headers)
    announced = any(name in headers for name in ANNOUNCED)
    return Result("trimmed" if announced else "completed", 0.0, status, read.tokens, read.text, headers=headers)


@dataclass
class _Read:
    tokens: int = 0
    text: str = ""
    error: str | None = None


def _read_body(api: Api, raw: bytes) -> _Read:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _Read(error=f"a 200 whose body is not JSON: {raw[:120]!r}")
    if isinstance(payload, dict) and "error" in payload:
        return _Read(error=_error_text(payload))
    if api == "embed":
        return _Read()
    if api == "llama" and isinstance(payload, list):  # a batch: one result per prompt
        reads = [_read_body(api, orjson.dumps(item)) for item in payload]
        failed = next((r.error for r in reads if r.error), None)
        return _Read(sum(r.tokens for r in reads), "".join(r.text for r in reads), failed)
    if not isinstance(payload, dict):
        return _Read(error=f"a 200 whose body is not an object: {raw[:120]!r}")
    if api == "ollama":
        message = payload.get("message") or {}
        text = message.get("content", "") if isinstance(message, dict) else str(payload.get("response", ""))
        return _Read(int(payload.get("eval_count") or 0), text or str(payload.get("response", "")))
    if api == "llama":
        return _Read(int(payload.get("tokens_predicted") or 0), str(payload.get("content", "")))
    usage = payload.get("usage") or {}
    choices = payload.get("choices") or [{}]
    first = choices[0] if isinstance(choices[0], dict) else {}
    message = first.get("message") or {}
    text = message.get("content") if isinstance(message, dict) else None
    return _Read(int(usage.get("completion_tokens") or 0), str(text if text is not None else first.get("text", "")))


def _read_stream(api: Api, raw: bytes) -> _Read:
    if api == "ollama":
        return _read_ndjson(raw)
    return _read_sse(api, raw)


def _read_ndjson(raw: bytes) -> _Read:
    read, done = _Read(), False
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            return _Read(read.tokens, read.text, f"a line that is not JSON: {line[:120]!r}")
        if "error" in event:
            return _Read(read.tokens, read.text, _error_text(event))
        message = event.get("message")
        read.text += message.get("content", "") if isinstance(message, dict) else str(event.get("response", ""))
        if event.get("done"):
            done = True
            read.tokens = int(event.get("eval_count") or 0)
    if not done:
        read.error = "the stream ended without its final done line"
    return read


def _read_sse(api: Api, raw: bytes) -> _Read:
    read, done, chunks, reported = _Read(), False, 0, None
    for line in raw.splitlines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return _Read(read.tokens, read.text, f"an event that is not JSON: {data[:120]!r}")
        if isinstance(event, dict) and "error" in event:
            return _Read(read.tokens, read.text, _error_text(event))
        if api == "llama":
            read.text += str(event.get("content", ""))
            chunks += 1
            if event.get("stop"):
                done = True
                reported = event.get("tokens_predicted", reported)
            continue
        usage = event.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            reported = usage["completion_tokens"]
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            piece = delta.get("content") if isinstance(delta, dict) else None
            piece = piece if piece is not None else choice.get("text")
            if piece:
                read.text += piece
                chunks += 1
            if choice.get("finish_reason"):
                done = True
    read.tokens = int(reported) if reported is not None else chunks
    if not done:
        read.error = "the stream ended without its final event"
    return read
