"""OpenAI's Responses API (``/v1/responses``): its ``input`` and ``instructions`` as the chat a backend renders.

    instructions                       -> a system message first
    input "text"                       -> one user message
    input [{"role", "content"}]        -> that message (content a string, or parts: input_text / output_text / text
                                          give their text, input_image an image)
    input [{"type": "function_call"}]  -> an assistant message calling the tool (name, arguments, call_id)
    input [{"type": "function_call_output"}] -> a tool message with its output
    tools [{"type": "function", "name", "description", "parameters"}] -> chat-completions tools

Items of other types (reasoning, web search calls, ...) are counted by their JSON text, and the prompt is then
marked as an approximation, so its count is an estimate with a margin, never 0.
"""

from __future__ import annotations

from typing import Any

from gateway.dialects import fields
from gateway.domain import Prompt
from gateway.tokens.countable_text import json_text

_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "refusal"})


def prompt_of(body: dict[str, Any]) -> Prompt:
    """The chat a backend renders for a Responses body (validated: wrong types raise InvalidField)."""
    instructions = fields.string_or_list(body, "instructions")
    given = fields.string_or_list(body, "input")
    messages: list[dict[str, Any]] = []
    exact = True
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif isinstance(instructions, list):
        messages.append({"role": "system", "content": _parts_text(instructions)})
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in fields.objects(given, "input"):
            message = _item_message(item)
            if message is None:
                message = {"role": "user", "content": json_text(item)}  # any JSON text: never raises
                exact = False
            messages.append(message)
    tools = tuple(_tool(t) for t in fields.objects(fields.optional_list(body, "tools") or [], "tools"))
    return Prompt(messages=tuple(messages), tools=tools, exact_shape=exact)


def chat_shape(item: Any) -> dict[str, Any]:
    """The chat message an input item stands for, for finding turns (trimming): an item of another type (reasoning,
    a web search call) belongs to the assistant's turn."""
    message = _item_message(item) if isinstance(item, dict) else None
    return message if message is not None else {"role": "assistant", "content": ""}


def _item_message(item: dict[str, Any]) -> dict[str, Any] | None:
    kind = item.get("type", "message")
    if kind == "message" and isinstance(item.get("role"), str):
        content = item.get("content")
        if isinstance(content, list):
            images = [p for p in content if isinstance(p, dict) and p.get("type") == "input_image"]
            message: dict[str, Any] = {"role": item["role"], "content": _parts_text(content)}
            if images:
                message["images"] = images
            return message
        return {"role": item["role"], "content": content if isinstance(content, str) else ""}
    if kind == "function_call":
        call = {"id": item.get("call_id", ""), "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else json_text(output)
        return {"role": "tool", "content": text, "tool_call_id": item.get("call_id", "")}
    return None


def _parts_text(parts: list[Any]) -> str:
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n".join(texts)


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") == "function" and "function" not in tool:
        function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
        return {"type": "function", "function": function}
    return tool
