"""The notice in a stream: one extra event in the dialect's own framing, before the first event that carries text.

    backend:  {"role"...}  {"content":"Hel"}              {"content":"lo"}  ...  [DONE]
    client:   {"role"...}  {"content":"[kvgate: ...]\\n\\n"}  {"content":"Hel"}  {"content":"lo"}  ...  [DONE]
                           ^ a copy of the event it precedes (its id, model, index), its text the notice

Until that event the stream is read event by event (NDJSON lines, SSE events up to their blank line) and every event
is passed on as its own bytes the moment it is whole; from then on the bytes pass through as they come, untouched,
unread. The one exception is the Responses API, whose closing events repeat the whole text (output_text.done,
content_part.done, output_item.done, response.completed): those of the part the notice went into are re-encoded
with the notice in front, so a client that keeps the final response (the OpenAI SDK's ``get_final_response``) has
the same text it streamed. The inserted event carries no usage or timing figures: usage stays the backend's.
Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.notice.shapes import Shape, add_to_part
from gateway.support.hop_headers import NDJSON, SSE

_NDJSON_SHAPES = (Shape.OLLAMA_CHAT, Shape.OLLAMA_GENERATE)
MAX_EVENT_BYTES = 1 << 20
"""An event still unfinished past this size is no event worth a notice: the rest of the stream passes as it comes
(what kvgate holds of a stream stays bounded whatever a backend sends)."""
_CLOSING = ("response.completed", "response.incomplete", "response.failed")


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _sse_end(buffer: bytearray) -> int:
    """The end of the first whole SSE event in ``buffer`` (after its blank line), or -1."""
    ends = [found + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (found := buffer.find(sep)) >= 0]
    return min(ends, default=-1)


def _sse_fields(raw: bytes) -> tuple[str | None, bytes]:
    """An SSE event's type (its ``event:`` line) and its data (``data:`` lines joined)."""
    kind: str | None = None
    data: list[bytes] = []
    for line in raw.splitlines():
        name, _, value = line.partition(b":")
        value = value.removeprefix(b" ")
        if name == b"event":
            kind = value.decode("utf-8", "replace")
        elif name == b"data":
            data.append(value)
    return kind, b"\n".join(data)


def _sse(kind: str | None, payload: Any) -> bytes:
    head = b"" if kind is None else b"event: " + kind.encode() + b"\n"
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


class NoticeStream:
    """Fed the backend's chunks in order; returns what to send the client instead (``end`` once, at the end)."""

    def __init__(self, shape: Shape, line: str, kind: str, choices: int = 1) -> None:
        self._shape, self._line, self._kind = shape, line, kind
        self._choices = max(1, choices)
        self._noticed: set[int] = set()
        self._part: tuple[str, int] | None = None  # Responses: (item id, content index) the notice went into
        self._buffer = bytearray()
        self._passing = False

    @staticmethod
    def framing_of(shape: Shape) -> str:
        return NDJSON if shape in _NDJSON_SHAPES else SSE

    def feed(self, chunk: bytes) -> bytes:
        if self._passing:
            return chunk
        self._buffer += chunk
        out = bytearray()
        while not self._passing:
            end = self._buffer.find(b"\n") + 1 if self._kind == NDJSON else _sse_end(self._buffer)
            if end <= 0:
                break
            raw = bytes(self._buffer[:end])
            del self._buffer[:end]
            out += self._event(raw)
        if len(self._buffer) > MAX_EVENT_BYTES:
            self._passing = True
        if self._passing and self._buffer:
            out += self._buffer
            self._buffer.clear()
        return bytes(out)

    def end(self) -> bytes:
        """What is still held (an event the stream ended in the middle of), as it came."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        self._passing = True
        return rest

    def _event(self, raw: bytes) -> bytes:
        if self._kind == NDJSON:
            payload = _json(raw.strip())
            if isinstance(payload, dict):
                found = self._ollama(payload)
                if found is not None:
                    self._passing = True
                    return orjson.dumps(found) + b"\n" + raw
            return raw
        kind, data = _sse_fields(raw)
        payload = _json(data) if data else None
        if not isinstance(payload, dict):
            return raw
        if self._shape is Shape.RESPONSES:
            return self._responses(kind, payload, raw)
        clone = self._sse_clone(payload)
        return raw if clone is None else _sse(kind, clone) + raw

    def _ollama(self, line: dict[str, Any]) -> dict[str, Any] | None:
        """The notice line before the first NDJSON line with text: its model and time, the notice as its text."""
        head: dict[str, Any] = {key: line[key] for key in ("model", "created_at") if key in line}
        if self._shape is Shape.OLLAMA_CHAT:
            message = line.get("message")
            if not isinstance(message, dict) or not _text(message.get("content")):
                return None
            return {**head, "message": {"role": message.get("role", "assistant"), "content": self._line},
                    "done": False}
        return {**head, "response": self._line, "done": False} if _text(line.get("response")) else None

    def _sse_clone(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        shape = self._shape
        if shape is Shape.ANTHROPIC:
            delta = payload.get("delta")
            if payload.get("type") != "content_block_delta" or not isinstance(delta, dict) \
                    or delta.get("type") != "text_delta" or not _text(delta.get("text")):
                return None
            self._passing = True
            return {"type": "content_block_delta", "index": payload.get("index", 0),
                    "delta": {"type": "text_delta", "text": self._line}}
        if shape is Shape.LLAMA_COMPLETION:
            if not _text(payload.get("content")):
                return None
            self._passing = True
            clone: dict[str, Any] = {key: payload[key] for key in ("index", "id_slot", "model") if key in payload}
            return {**clone, "content": self._line, **({"tokens": []} if "tokens" in payload else {}), "stop": False}
        return self._choice_clone(payload)

    def _choice_clone(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        """OpenAI chat and completion chunks: one clone chunk for the choices whose first text this is."""
        chat = self._shape is Shape.OPENAI_CHAT
        choices = payload.get("choices")
        cloned = []
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or not isinstance(choice.get("index", 0), int):
                continue
            index = choice.get("index", 0)
            delta = choice.get("delta") if chat else choice
            if index in self._noticed or not isinstance(delta, dict) or not _text(delta.get("content" if chat
                                                                                               else "text")):
                continue
            self._noticed.add(index)
            said: dict[str, Any] = {"index": index}
            if chat:
                said["delta"] = {**({"role": delta["role"]} if "role" in delta else {}), "content": self._line}
            else:
                said["text"] = self._line
            said.update({"logprobs": None} if "logprobs" in choice else {})
            said["finish_reason"] = None
            cloned.append(said)
        if not cloned:
            return None
        self._passing = len(self._noticed) >= self._choices
        clone = {key: value for key, value in payload.items() if key not in ("usage", "timings", "choices")}
        return {**clone, "choices": cloned}

    def _responses(self, kind: str | None, payload: dict[str, Any], raw: bytes) -> bytes:
        kind_of = payload.get("type", kind)
        if self._part is None:
            if kind_of != "response.output_text.delta" or not _text(payload.get("delta")):
                return raw
            self._part = (str(payload.get("item_id")), _index(payload.get("content_index")))
            clone = {**payload, "delta": self._line, **({"logprobs": []} if "logprobs" in payload else {})}
            return _sse(kind, clone) + raw
        item_id, index = self._part
        changed = False
        if kind_of in ("response.output_text.done", "response.content_part.done") \
                and str(payload.get("item_id")) == item_id and _index(payload.get("content_index")) == index:
            holder = payload if kind_of == "response.output_text.done" else payload.get("part")
            changed = _prefix_text(holder, self._line)
        elif kind_of == "response.output_item.done":
            changed = add_to_part({"output": [payload.get("item")]}, item_id, index, self._line)
        elif kind_of in _CLOSING:
            self._passing = True
            changed = add_to_part(payload.get("response"), item_id, index, self._line)
        return _sse(kind, payload) if changed else raw


def _index(value: Any) -> int:
    """A content index as the Responses events carry it (absent in llama-server's: its one part, 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _prefix_text(holder: Any, line: str) -> bool:
    if isinstance(holder, dict) and isinstance(holder.get("text"), str):
        holder["text"] = line + holder["text"]
        return True
    return False
