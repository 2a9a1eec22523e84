"""The normal end of a stream kvgate ends itself, in the client's dialect: what a backend sends when an answer
reaches its output limit, plus a ``kvgate`` field saying who ended it and why.

    Ollama /api/chat         {"model", "created_at", "message": {"role": "assistant", "content": ""},
                              "done": true, "done_reason": "length", "kvgate": "..."}
    Ollama /api/generate     {"model", "created_at", "response": "", "done": true, "done_reason": "length", ...}
    OpenAI chat              data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {},
                              "finish_reason": "length"}], "kvgate": "..."}  then  data: [DONE]
    OpenAI completions       data: {"object": "text_completion", "choices": [{"index": 0, "text": "",
                              "finish_reason": "length", "logprobs": null}], ...}  then  data: [DONE]
    llama-server /completion data: {"content": "", "stop": true, "stop_type": "limit", ...}

The SDKs read these as any other final event (``finish_reason`` / ``done_reason`` "length"), so a client that
handles an answer cut at its limit handles this one. Which streams kvgate may end is ``endable``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

from gateway.domain import Dialect, Operation


@dataclass(frozen=True, slots=True)
class StreamEnding:
    """What the final event names: the route's dialect and operation, the model, and the request's id."""

    dialect: Dialect
    operation: Operation
    model: str
    request_id: str


def endable(dialect: Dialect, operation: Operation) -> bool:
    """Whether kvgate can end a stream of this route with a normal final event (and count its events as tokens)."""
    if dialect in (Dialect.OLLAMA, Dialect.OPENAI):
        return operation in (Operation.CHAT, Operation.GENERATE)
    return dialect is Dialect.LLAMACPP and operation is Operation.GENERATE


def stream_end_event(ending: StreamEnding, reason: str) -> bytes:
    """The final event(s) of a stream kvgate ended (module docstring)."""
    dialect, model = ending.dialect, ending.model
    if dialect is Dialect.OLLAMA:
        created = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        body: dict[str, object] = {"model": model, "created_at": created}
        if ending.operation is Operation.CHAT:
            body["message"] = {"role": "assistant", "content": ""}
        else:
            body["response"] = ""
        body.update(done=True, done_reason="length", kvgate=reason)
        return orjson.dumps(body) + b"\n"
    if dialect is Dialect.OPENAI:
        created_s = int(time.time())
        if ending.operation is Operation.CHAT:
            chunk = {"id": f"chatcmpl-{ending.request_id}", "object": "chat.completion.chunk", "created": created_s,
                     "model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                     "kvgate": reason}
        else:
            chunk = {"id": f"cmpl-{ending.request_id}", "object": "text_completion", "created": created_s,
                     "model": model, "choices": [{"index": 0, "text": "", "finish_reason": "length",
                                                  "logprobs": None}], "kvgate": reason}
        return b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"
    final = {"content": "", "stop": True, "stop_type": "limit", "truncated": False, "model": model, "kvgate": reason}
    return b"data: " + orjson.dumps(final) + b"\n\n"
