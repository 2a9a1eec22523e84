"""Ollama's reading of an OpenAI Responses request (``openai/responses.go`` ``FromResponsesRequest``).

    instructions                      -> a system message first
    input "text"                      -> one user message ("" adds none)
    input [{type: "message", ...}]    -> that message; content a string or input_text / output_text / input_image
                                         parts (input_file: 400 "file inputs are not currently supported")
    input [{type: "function_call"}]   -> an assistant turn calling the tool (rendered as its JSON, for counting)
    input [{type: "function_call_output"}] -> a tool message
    max_output_tokens -> num_predict; temperature defaults to 1.0, top_p only when given; reasoning.effort -> think
    stream defaults to false; there is no num_ctx and no keep_alive.

Reasoning and web_search_call items are history the simulator's templates do not render; they are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from kvsim.failures import SimError
from kvsim.ollama.gojson import json_kind, type_error
from kvsim.ollama.ollama_requests import get
from kvsim.templates import Message

GO_TYPE = "ResponsesRequest"
_EFFORTS = ("none", "minimal", "low", "medium", "high", "max", "xhigh", "ultra")  # thinkFromReasoningEffort
_ITEM_STRUCT = 'struct { Type string "json:\\"type\\""; Role string "json:\\"role\\"" }'
_IMAGE_PREFIXES = (*(f"data:image/{t};base64," for t in ("jpeg", "jpg", "png", "webp")), "data:;base64,")


@dataclass(frozen=True)
class ResponsesBody:
    model: str
    messages: tuple[Message, ...]
    options: dict[str, Any]
    think: bool
    tools: bool
    stream: bool


def parse_responses(body: dict[str, Any]) -> ResponsesBody:
    for key, kind in (("model", str), ("instructions", str), ("stream", bool), ("max_output_tokens", int)):
        get(body, key, kind, GO_TYPE)
    for key in ("temperature", "top_p"):
        _float(body, key)
    tools = get(body, "tools", list, GO_TYPE, [])
    messages = [Message("system", body["instructions"])] if body.get("instructions") else []
    messages += _input(body.get("input"))
    options: dict[str, Any] = {"temperature": body.get("temperature", 1.0)}
    if body.get("top_p") is not None:
        options["top_p"] = body["top_p"]
    if body.get("max_output_tokens") is not None:
        options["num_predict"] = int(body["max_output_tokens"])
    return ResponsesBody(
        model=body.get("model") or "",
        messages=tuple(messages),
        options=options,
        think=_think(body.get("reasoning")),
        tools=bool(tools),
        stream=body.get("stream") is True,
    )


def _float(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise type_error(GO_TYPE, key, value, "float64")


def _think(reasoning: Any) -> bool:
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if not effort:
        return False
    if effort not in _EFFORTS:
        raise SimError(
            400,
            f'invalid reasoning value: "{effort}" (must be "minimal", "low", "medium", "high", "xhigh", "ultra", '
            '"max", or "none")',
        )
    return bool(effort != "none")


def _input(raw: Any) -> list[Message]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [Message("user", raw)] if raw else []
    if not isinstance(raw, list):
        kind = json_kind(raw)
        raise SimError(
            400,
            f"input must be a string or array: json: cannot unmarshal {kind} into Go value of type []json.RawMessage",
        )
    out: list[Message] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise SimError(
                400, f"input[{i}]: json: cannot unmarshal {json_kind(item)} into Go value of type {_ITEM_STRUCT}"
            )
        out += _item(i, item)
    return out


def _item(i: int, item: dict[str, Any]) -> list[Message]:
    kind = item.get("type") or ("message" if item.get("role") else "")
    if kind == "message":
        text, images = _content(i, item.get("content"))
        return [Message(str(item.get("role", "")).lower(), text, images)]
    if kind == "function_call":
        return [Message("assistant", _call_text(item))]
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _content(i, output)[0] if isinstance(output, list) else ""
        return [Message("tool", text)]
    if kind in ("reasoning", "web_search_call"):
        return []
    if not kind:
        raise SimError(400, f"input[{i}]: input item missing required 'type' field")
    raise SimError(400, f'input[{i}]: unknown input item type: "{kind}"')


def _content(i: int, content: Any) -> tuple[str, int]:
    """(text, image count) of a message's content: a string, or a list of typed parts."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        raise SimError(
            400,
            f"input[{i}]: content must be a string or array: json: cannot unmarshal "
            f"{json_kind(content)} into Go value of type []json.RawMessage",
        )
    text, images = "", 0
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text"):
            text += str(part.get("text", ""))
        elif kind == "input_image":
            images += _image(str(part.get("image_url") or ""))
        elif kind == "input_file":
            raise SimError(400, "file inputs are not currently supported")
        else:
            raise SimError(400, f"input[{i}]: content[{j}]: unknown content type: {kind or ''}")
    return text, images


def _image(url: str) -> int:
    """``decodeImageURL``: only base64 data URLs; an item without a URL is skipped."""
    if not url:
        return 0
    if url.startswith(("http://", "https://")):
        raise SimError(400, "image URLs are not currently supported, please use base64 encoded data instead")
    if not url.startswith(_IMAGE_PREFIXES):
        raise SimError(400, "invalid image input")
    return 1


def _call_text(item: dict[str, Any]) -> str:
    arguments = item.get("arguments") or ""
    try:
        parsed = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError as exc:
        raise SimError(400, f"failed to parse function call arguments: {exc}") from None
    return orjson.dumps({"name": item.get("name", ""), "parameters": parsed}).decode()
