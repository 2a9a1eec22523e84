"""The reply shapes of llama-server's generation routes (``server-task.cpp`` ``to_json_*``), one class each.

A format renders the stream's events (``start`` before the first token, ``delta`` per token, ``end`` after the
last, ``finish`` once the request's every task ended), the non-streamed body, and an error after the headers:
``data: {"error": ...}`` for every route but Anthropic's ``event: error``. OpenAI chat and completions streams end
with ``data: [DONE]``; the native, Responses and Anthropic streams end without it.

A batch (several prompts) has one format per task, each with the task's ``index``; its stream opens with
``data: null`` (as the real server's does) and its tasks' events interleave; ``merge`` makes the body: an array of
the native results, or the OpenAI completion of the first with every task's choice (its usage stays the first's).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import orjson

from kvsim.llama_server.llama_engine import ServerResult

BUILD_INFO = "b11434-sim"


def sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def timings(r: ServerResult, n_pred: int) -> dict[str, Any]:
    prompt_ms, pred_ms = r.prompt_s * 1000, r.predicted_s * 1000
    return {
        "cache_n": 0,
        "prompt_n": r.n_prompt,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(r.n_prompt, 1),
        "prompt_per_second": r.n_prompt / r.prompt_s if r.prompt_s else 0.0,
        "predicted_n": n_pred,
        "predicted_ms": pred_ms,
        "predicted_per_token_ms": pred_ms / max(n_pred, 1),
        "predicted_per_second": n_pred / r.predicted_s if r.predicted_s else 0.0,
    }


def oai_usage(r: ServerResult) -> dict[str, Any]:
    n = len(r.content_ids)
    return {
        "completion_tokens": n,
        "prompt_tokens": r.n_prompt,
        "total_tokens": n + r.n_prompt,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


@dataclass
class Format(ABC):
    """Base: the head fields every OpenAI-style object carries; each route's format writes its own chunks."""

    ident: str
    created: int
    model: str
    include_usage: bool = False
    index: int = 0

    def head(self) -> dict[str, Any]:
        return {"created": self.created, "id": self.ident, "model": self.model, "system_fingerprint": BUILD_INFO}

    def start(self) -> bytes:
        return b""

    def finish(self) -> bytes:
        """After the last task's ``end``."""
        return b""

    @staticmethod
    def merge(bodies: list[dict[str, Any]]) -> Any:
        """The body of a batch: the native results as an array (see the subclasses)."""
        return bodies[0] if len(bodies) == 1 else bodies

    @abstractmethod
    def delta(self, piece: str, token: int, r: ServerResult) -> bytes:
        """See the subclasses."""

    @abstractmethod
    def end(self, r: ServerResult, text: str) -> bytes:
        """See the subclasses."""

    @abstractmethod
    def body(self, r: ServerResult, text: str) -> dict[str, Any]:
        """See the subclasses."""

    def error_event(self, error: dict[str, Any]) -> bytes:
        return sse(error)


class ChatFormat(Format):
    def _chunk(self, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {"choices": [choice], **self.head(), "object": "chat.completion.chunk", **extra}

    def start(self) -> bytes:
        return sse(self._chunk({"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}))

    def delta(self, piece: str, token: int, r: ServerResult) -> bytes:
        return sse(self._chunk({"finish_reason": None, "index": 0, "delta": {"content": piece}}))

    def end(self, r: ServerResult, text: str) -> bytes:
        n = len(r.content_ids)
        out = sse(self._chunk({"finish_reason": r.finish_reason, "index": 0, "delta": {}}, timings=timings(r, n)))
        if self.include_usage:
            out += sse({"choices": [], **self.head(), "object": "chat.completion.chunk", "usage": oai_usage(r)})
        return out

    def finish(self) -> bytes:
        return b"data: [DONE]\n\n"

    def body(self, r: ServerResult, text: str) -> dict[str, Any]:
        choice = {"finish_reason": r.finish_reason, "index": 0, "message": {"role": "assistant", "content": text}}
        return {
            "choices": [choice],
            **self.head(),
            "object": "chat.completion",
            "usage": oai_usage(r),
            "timings": timings(r, len(r.content_ids)),
        }


class OaiCompletionFormat(Format):
    def delta(self, piece: str, token: int, r: ServerResult) -> bytes:
        choice = {"text": piece, "index": self.index, "logprobs": None, "finish_reason": None}
        return sse({"choices": [choice], **self.head(), "object": "text_completion"})

    def end(self, r: ServerResult, text: str) -> bytes:
        choice = {"text": "", "index": self.index, "logprobs": None, "finish_reason": r.finish_reason}
        final = {"choices": [choice], **self.head(), "object": "text_completion"}
        if self.include_usage:
            final["usage"] = oai_usage(r)
        return sse(final)

    def finish(self) -> bytes:
        return b"data: [DONE]\n\n"

    @staticmethod
    def merge(bodies: list[dict[str, Any]]) -> Any:
        """Every task's choice in the first task's completion (``handle_completions_impl``)."""
        merged = dict(bodies[0])
        merged["choices"] = [body["choices"][0] for body in bodies]
        return merged

    def body(self, r: ServerResult, text: str) -> dict[str, Any]:
        choice = {"text": text, "index": self.index, "logprobs": None, "finish_reason": r.finish_reason}
        return {
            "choices": [choice],
            **self.head(),
            "object": "text_completion",
            "usage": oai_usage(r),
            "timings": timings(r, len(r.content_ids)),
        }


class NativeFormat(Format):
    """``/completion``, ``/completions`` and ``/infill``."""

    n_predict: int = -1

    def delta(self, piece: str, token: int, r: ServerResult) -> bytes:
        return sse(
            {
                "index": self.index,
                "content": piece,
                "tokens": [token],
                "stop": False,
                "id_slot": r.id_slot,
                "tokens_predicted": len(r.content_ids),
                "tokens_evaluated": r.n_prompt,
            }
        )

    def end(self, r: ServerResult, text: str) -> bytes:
        return sse(self._final(r, ""))

    def body(self, r: ServerResult, text: str) -> dict[str, Any]:
        return self._final(r, text)

    def _final(self, r: ServerResult, text: str) -> dict[str, Any]:
        n = len(r.content_ids)
        return {
            "index": self.index,
            "content": text,
            "tokens": [],
            "id_slot": r.id_slot,
            "stop": True,
            "model": self.model,
            "tokens_predicted": n,
            "tokens_evaluated": r.n_prompt,
            "generation_settings": {"n_predict": self.n_predict},
            "prompt": "",
            "has_new_line": False,
            "truncated": r.stop_type == "limit",
            "stop_type": r.stop_type,
            "stopping_word": "",
            "tokens_cached": r.n_prompt + n,
            "timings": timings(r, n),
        }


class ResponsesFormat(Format):
    def _response(self, r: ServerResult, text: str) -> dict[str, Any]:
        n = len(r.content_ids)
        return {
            "completed_at": self.created,
            "created_at": self.created,
            "id": "resp_" + self.ident,
            "model": self.model,
            "object": "response",
            "output": [
                {
                    "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
                    "id": "msg_" + self.ident,
                    "role": "assistant",
                    "status": "completed",
                    "type": "message",
                }
            ],
            "status": "completed",
            "usage": {
                "input_tokens": r.n_prompt,
                "output_tokens": n,
                "total_tokens": n + r.n_prompt,
                "input_tokens_details": {"cached_tokens": 0},
            },
        }

    def start(self) -> bytes:
        created = {
            "id": "resp_" + self.ident,
            "object": "response",
            "created_at": self.created,
            "status": "in_progress",
        }
        return sse({"type": "response.created", "response": created}, "response.created")

    def delta(self, piece: str, token: int, r: ServerResult) -> bytes:
        event = "response.output_text.delta"
        return sse({"type": event, "item_id": "msg_" + self.ident, "delta": piece}, event)

    def end(self, r: ServerResult, text: str) -> bytes:
        done = sse(
            {"type": "response.output_text.done", "item_id": "msg_" + self.ident, "text": text},
            "response.output_text.done",
        )
        completed = {"type": "response.completed", "response": self._response(r, text)}
        return done + sse(completed, "response.completed")

    def body(self, r: ServerResult, text: str) -> dict[str, Any]:
        return self._response(r, text)


class AnthropicFormat(Format):
    @staticmethod
    def _stop_reason(r: ServerResult) -> str:
        return "end_turn" if r.stop_type == "eos" else "max_tokens"

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.ident,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        return sse({"type": "message_start", "message": message}, "message_start") + sse(block, "content_block_start")

    def delta(self, piece: str, token: int, r: ServerResult) -> bytes:
        event = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
        return sse(event, "content_block_delta")

    def end(self, r: ServerResult, text: str) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(r), "stop_sequence": None},
            "usage": {"output_tokens": len(r.content_ids)},
        }
        return (
            sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
            + sse(delta, "message_delta")
            + sse({"type": "message_stop"}, "message_stop")
        )

    def body(self, r: ServerResult, text: str) -> dict[str, Any]:
        return {
            "id": self.ident,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}] if text else [],
            "model": self.model,
            "stop_reason": self._stop_reason(r),
            "stop_sequence": None,
            "usage": {"cache_read_input_tokens": 0, "input_tokens": r.n_prompt, "output_tokens": len(r.content_ids)},
        }

    def error_event(self, error: dict[str, Any]) -> bytes:
        return sse(error["error"], "error")
