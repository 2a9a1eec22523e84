"""Ollama's reading of an Anthropic Messages request (``middleware/anthropic.go``, ``anthropic/anthropic.go``
``FromMessagesRequest``).

    checks, in order: body -> "model is required" -> "max_tokens is required and must be positive" ->
    "messages is required" -> block errors (image source, tool_use id / name, input_schema) -> ChatHandler
    system (a string, or text blocks joined) -> a system message first
    messages: content a string or blocks; text blocks concatenated, images counted, tool_use rendered as its JSON
              (for counting), tool_result blocks -> tool messages (before the user's own text)
    max_tokens -> num_predict; temperature / top_p / top_k / stop_sequences only when given (no 1.0 default)
    thinking is relaxed (``relax_thinking``): a model without the capability just does not think.

``estimate_input_tokens`` is ``EstimateInputTokens`` (bytes / 4), what ``message_start`` reports while the real
count is not known yet.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from kvsim.failures import SimError
from kvsim.ollama import gojson
from kvsim.ollama.gojson import json_kind, type_error
from kvsim.ollama.ollama_requests import get
from kvsim.templates import Message

GO_TYPE = "MessagesRequest"
_PARAM_STRUCT = 'struct { Role string "json:\\"role\\""; Content json.RawMessage "json:\\"content\\"" }'


@dataclass(frozen=True)
class MessagesBody:
    model: str
    messages: tuple[Message, ...]
    options: dict[str, Any]
    tools: bool
    stream: bool


def parse_messages_request(body: dict[str, Any]) -> MessagesBody:
    for key, kind in (("model", str), ("max_tokens", int), ("stream", bool), ("top_k", int)):
        get(body, key, kind, GO_TYPE)
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise type_error(GO_TYPE, key, value, "float64")
    raw_messages = get(body, "messages", list, GO_TYPE, [])
    tools = get(body, "tools", list, GO_TYPE, [])
    blocks = [_blocks(m) for m in raw_messages]
    if not body.get("model"):
        raise SimError(400, "model is required")
    if int(body.get("max_tokens") or 0) <= 0:
        raise SimError(400, "max_tokens is required and must be positive")
    if not raw_messages:
        raise SimError(400, "messages is required")
    messages = _system(body.get("system"))
    for msg, content in zip(raw_messages, blocks, strict=True):
        messages += _convert(str(msg.get("role") or "").lower(), content)
    for tool in tools:
        _check_tool(tool)
    return MessagesBody(
        model=body["model"],
        messages=tuple(messages),
        options=_options(body),
        tools=bool(tools),
        stream=body.get("stream") is True,
    )


def _options(body: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {"num_predict": int(body["max_tokens"])}
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k")):
        if body.get(src) is not None:
            options[dst] = body[src]
    stop = body.get("stop_sequences")
    if isinstance(stop, list) and stop:
        options["stop"] = [s for s in stop if isinstance(s, str)]
    return options


def _blocks(msg: Any) -> list[dict[str, Any]]:
    """``MessageParam.UnmarshalJSON``: content is always a list of blocks (a string is one text block)."""
    if not isinstance(msg, dict):
        raise SimError(400, f"json: cannot unmarshal {json_kind(msg)} into Go value of type {_PARAM_STRUCT}")
    content = msg.get("content")
    if content is None or isinstance(content, str):
        return [{"type": "text", "text": content or ""}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise SimError(
            400, f"json: cannot unmarshal {json_kind(content)} into Go value of type []anthropic.ContentBlock"
        )
    return content


def _system(system: Any) -> list[Message]:
    if isinstance(system, str):
        return [Message("system", system)] if system else []
    if isinstance(system, list):
        text = "".join(
            b["text"]
            for b in system
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
        return [Message("system", text)] if text else []
    return []


def _convert(role: str, blocks: list[dict[str, Any]]) -> list[Message]:
    """``convertMessage``: one message per turn, tool results as tool messages."""
    text, images, results = "", 0, []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            text += str(block.get("text") or "")
        elif kind == "image":
            images += _image(block.get("source"))
        elif kind in ("tool_use", "server_tool_use"):
            if kind == "tool_use":
                for key in ("id", "name"):
                    if not block.get(key):
                        raise SimError(400, f"tool_use block missing required '{key}' field")
            call = {"name": block.get("name", ""), "parameters": block.get("input") or {}}
            text += gojson.dumps(call).decode()
        elif kind in ("tool_result", "web_search_tool_result"):
            results.append(Message("tool", _result_text(block.get("content"))))
    own = [Message(role, text, images)] if text or images else []
    return results + own if role == "user" else own + results


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [c for c in content if isinstance(c, dict)]
        for part in parts:
            if part.get("type") == "image":
                _image(part.get("source"))
        return "".join(str(p.get("text") or "") for p in parts if p.get("type") == "text")
    return ""


def _image(source: Any) -> int:
    if not isinstance(source, dict):
        raise SimError(400, "invalid image source")
    kind = source.get("type") or ""
    if kind != "base64":
        raise SimError(400, f"invalid image source type: {kind}. Only base64 images are supported.")
    try:
        base64.b64decode(str(source.get("data") or ""), validate=True)
    except (binascii.Error, ValueError):
        raise SimError(400, "invalid base64 image data: illegal base64 data at input byte 0") from None
    return 1


def _check_tool(tool: Any) -> None:
    if not isinstance(tool, dict):
        raise type_error(GO_TYPE, "tools", tool, "anthropic.Tool")
    schema = tool.get("input_schema")
    if str(tool.get("type") or "").startswith("web_search") or schema is None or isinstance(schema, dict):
        return
    name = tool.get("name", "")
    raise SimError(
        400,
        f'invalid input_schema for tool "{name}": json: cannot unmarshal {json_kind(schema)} into Go value of type '
        "api.ToolFunctionParameters",
    )


def estimate_input_tokens(body: dict[str, Any]) -> int:
    """``EstimateCountTokens``: the bytes of system, roles, block texts and tools, divided by 4 (at least 1)."""
    total = _count_any(body.get("system"))
    messages = body.get("messages") or []
    for msg in messages:
        total += len(str(msg.get("role") or "").encode()) + sum(_count_block(b) for b in _blocks(msg))
    for tool in body.get("tools") or []:
        schema = tool.get("input_schema")
        total += len(str(tool.get("name") or "").encode()) + len(str(tool.get("description") or "").encode())
        total += len(gojson.dumps(schema)) if schema is not None else 0
    tokens = total // 4
    return 1 if tokens == 0 and (messages or body.get("system") is not None) else tokens


def _count_any(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content.encode())
    if isinstance(content, list):
        return sum(_count_block(b) for b in content if isinstance(b, dict))
    return len(gojson.dumps(content))


def _count_block(block: dict[str, Any]) -> int:
    total = 0
    for key in ("text", "thinking"):
        if isinstance(block.get(key), str):
            total += len(block[key].encode())
    if block.get("type") in ("tool_use", "tool_result"):
        total += len(gojson.dumps(block))
    return total
