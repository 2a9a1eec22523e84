"""Parsing Ollama's native request bodies (``api/types.go``) with Go's error messages for wrong types."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvsim.failures import SimError
from kvsim.ollama.godur import DurationError, parse_keep_alive
from kvsim.ollama.gojson import type_error
from kvsim.templates import Message

_GO_TYPES: dict[type, str] = {str: "string", bool: "bool", int: "int", dict: "map[string]interface {}"}


def get(body: Mapping[str, Any], key: str, kind: type, go_struct: str, default: Any = None) -> Any:
    """``body[key]`` if it has the JSON type Go expects (null = absent), else Go's unmarshal error."""
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not ok:
        raise type_error(go_struct, key, value, _GO_TYPES.get(kind, "[]interface {}"))
    return value


def keep_alive(body: Mapping[str, Any]) -> float | None:
    value = body.get("keep_alive")
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except DurationError as exc:
        raise SimError(400, str(exc)) from None


def top_logprobs(body: Mapping[str, Any], go_struct: str) -> None:
    n = get(body, "top_logprobs", int, go_struct, 0)
    if n < 0 or n > 20:
        raise SimError(400, "top_logprobs must be between 0 and 20")


def images(value: Any, go_struct: str, field: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise type_error(go_struct, field, value, "[]api.ImageData")
    return len(value)


@dataclass(frozen=True)
class ChatBody:
    model: str
    messages: tuple[Message, ...]
    options: dict[str, Any] | None
    keep_alive_s: float | None
    stream: bool
    truncate: bool
    shift: bool | None
    think: Any
    has_tools: bool


def parse_messages(raw: Any) -> tuple[Message, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise type_error("ChatRequest", "messages", raw, "[]api.Message")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise type_error("ChatRequest", "messages", item, "api.Message")
        role = get(item, "role", str, "ChatRequest.messages", "")
        content = get(item, "content", str, "ChatRequest.messages", "")
        out.append(Message(role.lower(), content, images(item.get("images"), "ChatRequest.messages", "images")))
    return tuple(out)


def parse_chat(body: Mapping[str, Any]) -> ChatBody:
    s = "ChatRequest"
    tools = get(body, "tools", list, s, [])
    parsed = ChatBody(
        model=get(body, "model", str, s, ""),
        messages=parse_messages(body.get("messages")),
        options=get(body, "options", dict, s),
        keep_alive_s=keep_alive(body),
        stream=get(body, "stream", bool, s, True),
        truncate=get(body, "truncate", bool, s, True),
        shift=get(body, "shift", bool, s),
        think=body.get("think"),
        has_tools=bool(tools),
    )
    top_logprobs(body, s)
    return parsed


@dataclass(frozen=True)
class GenerateBody:
    model: str
    prompt: str
    suffix: str
    system: str
    template: str
    context: tuple[int, ...]
    raw: bool
    images: int
    options: dict[str, Any] | None
    keep_alive_s: float | None
    stream: bool
    truncate: bool
    shift: bool | None
    think: Any


def parse_generate(body: Mapping[str, Any]) -> GenerateBody:
    s = "GenerateRequest"
    context = get(body, "context", list, s, [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise type_error(s, "context", context, "[]int")
    parsed = GenerateBody(
        model=get(body, "model", str, s, ""),
        prompt=get(body, "prompt", str, s, ""),
        suffix=get(body, "suffix", str, s, ""),
        system=get(body, "system", str, s, ""),
        template=get(body, "template", str, s, ""),
        context=tuple(context),
        raw=get(body, "raw", bool, s, False),
        images=images(body.get("images"), s, "images"),
        options=get(body, "options", dict, s),
        keep_alive_s=keep_alive(body),
        stream=get(body, "stream", bool, s, True),
        truncate=get(body, "truncate", bool, s, True),
        shift=get(body, "shift", bool, s),
        think=body.get("think"),
    )
    top_logprobs(body, s)
    return parsed


def think_requested(think: Any) -> bool:
    """``ThinkValue.Bool``: true, or any effort level string."""
    if isinstance(think, bool):
        return think
    return isinstance(think, str) and think in ("low", "medium", "high", "max")


def parse_embed_input(raw: Any) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw] if raw else []
    if isinstance(raw, list) and all(isinstance(v, str) for v in raw):
        return list(raw)
    raise SimError(400, "invalid input type")
