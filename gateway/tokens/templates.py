"""Chat templates rendered in pure Python, the way llama-server renders them (common/chat.cpp + its Jinja engine).

Supported families, recognized from the template source (GET /props `chat_template`, or the GGUF's
`tokenizer.chat_template`):

    llama3.1   Llama 3.1 / 3.2 / 3.3 Instruct (system block with "Cutting Knowledge Date", tools in the first
               user message, one tool call per assistant turn, tool results as ipython)
    llama3     the original Llama 3 Instruct template (no tools)
    chatml     llama.cpp's built-in default (used when a model has no template): <|im_start|>role ... <|im_end|>

The renderer returns segments whose concatenation is the prompt without BOS (llama-server strips a leading BOS
from the rendered text and adds it again when tokenizing). Segments break at message boundaries so that counts can
be cached per message. Anything a family cannot render the way the server would (tools for chatml, two tool calls
for Llama 3.1) raises TemplateError, and the caller falls back to another counter.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.tokens.count import Message, Tool
from gateway.tokens.countable_text import content_text
from gateway.tokens.tojson import llama_tojson

_TRIM = " \t\n\v\f\r"  # C isspace(): what the Jinja `trim` filter strips in llama.cpp
_LLAMA_HEADER = "<|start_header_id|>{role}<|end_header_id|>\n\n"
_LLAMA_EOT = "<|eot_id|>"
_LLAMA31_TOOLS_INTRO = (
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that "
    "best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
)


class TemplateError(ValueError):
    """Raised when a chat cannot be rendered the way the server would render it."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """A message normalized as llama-server does before rendering."""

    role: str
    content: str
    tool_calls: tuple[tuple[str, Any], ...] = ()  # (function name, arguments as parsed JSON)


Renderer = Callable[[Sequence[ChatMessage], Sequence[Tool], dt.date], list[str]]


def detect_template(source: str | None) -> str | None:
    """The family name of a template source, or None when it is not one rendered here."""
    if source is None or source.strip() in ("", "chatml"):
        return "chatml"
    if "<|start_header_id|>" in source and "<|eot_id|>" in source:
        if "Cutting Knowledge Date" in source and "tools_in_user_message" in source:
            return "llama3.1"
        if "tool" not in source and "date_string" not in source:
            return "llama3"
        return None
    if source.strip() == _CHATML_SOURCE.strip():
        return "chatml"
    return None


def normalize_messages(messages: Sequence[Message]) -> list[ChatMessage]:
    """Roles, content and tool calls as llama-server hands them to the template."""
    out = []
    for message in messages:
        role = message.get("role") or "user"
        if role == "developer":
            role = "system"
        content = message.get("content")
        text = content if isinstance(content, str) else content_text(content)
        calls = message.get("tool_calls")
        out.append(ChatMessage(str(role), text, tuple(_tool_call(c) for c in calls) if calls else ()))
    return out


def _tool_call(call: Any) -> tuple[str, Any]:
    function = call.get("function", call) if isinstance(call, Mapping) else {}
    if not isinstance(function, Mapping):
        raise TemplateError("tool call without a function")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError as exc:
            raise TemplateError(f"tool call arguments are not JSON: {exc}") from exc
    return str(function.get("name", "")), arguments


def render(name: str, messages: Sequence[Message], tools: Sequence[Tool] = (), *, today: dt.date) -> list[str]:
    """Segments of the prompt for template family `name` (see detect_template).

    A final assistant message is a prefill, as llama-server treats it: the chat before it is rendered with the
    generation prompt and the message's content follows, unterminated.
    """
    renderer = _RENDERERS.get(name)
    if renderer is None:
        raise TemplateError(f"no renderer for chat template {name!r}")
    prefill: str | None = None
    if messages and messages[-1].get("role") == "assistant":
        if messages[-1].get("tool_calls"):
            raise TemplateError("Cannot continue an assistant message that contains tool calls.")
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise TemplateError("Cannot have 2 or more assistant messages at the end of the list.")
        prefill = content_text(messages[-1].get("content"), separator="\n\n")
        messages = messages[:-1]
    segments = renderer(normalize_messages(messages), normalize_tools(tools), today)
    if prefill:
        segments.append(prefill)
    return segments


def normalize_tools(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """Tools rebuilt as llama-server does: type, then function {name, description, parameters}; nothing else."""
    out = []
    for tool in tools:
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, Mapping) or "name" not in function:
            raise TemplateError(f"llama-server rejects this tool: {str(tool)[:80]}")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": function["name"],
                    "description": function.get("description", ""),
                    "parameters": function.get("parameters", {}),
                },
            }
        )
    return out


def _trim(text: str) -> str:
    return text.strip(_TRIM)


def _render_llama31(messages: Sequence[ChatMessage], tools: Sequence[Tool], today: dt.date) -> list[str]:
    rest = list(messages)
    system_message = ""
    if rest and rest[0].role == "system":
        system_message = _trim(rest.pop(0).content)
    head = _LLAMA_HEADER.format(role="system")
    if tools:
        head += "Environment: ipython\n"
    head += f"Cutting Knowledge Date: December 2023\nToday Date: {today.strftime('%d %b %Y')}\n\n"
    segments = [head + system_message + _LLAMA_EOT]
    if tools:
        if not rest:
            raise TemplateError("Cannot put tools in the first user message when there's no first user message!")
        first = _trim(rest.pop(0).content)
        described = "".join(llama_tojson(tool, indent=4) + "\n\n" for tool in tools)
        segments.append(_LLAMA_HEADER.format(role="user") + _LLAMA31_TOOLS_INTRO + described + first + _LLAMA_EOT)
    segments.extend(map(_llama31_message, rest))
    segments.append(_LLAMA_HEADER.format(role="assistant"))
    return segments


def _llama31_message(message: ChatMessage) -> str:
    if message.tool_calls:
        if len(message.tool_calls) != 1:
            raise TemplateError("This model only supports single tool-calls at once!")
        name, arguments = message.tool_calls[0]
        call = '{"name": "' + name + '", "parameters": ' + llama_tojson(arguments) + "}"
        return f"<|start_header_id|>assistant<|end_header_id|>\n\n{call}<|eot_id|>"
    if message.role in ("tool", "ipython"):
        # A string is "iterable" to the template, so the result is written as a JSON string.
        return f"<|start_header_id|>ipython<|end_header_id|>\n\n{llama_tojson(message.content)}<|eot_id|>"
    return f"<|start_header_id|>{message.role}<|end_header_id|>\n\n{message.content.strip(_TRIM)}<|eot_id|>"


def _render_llama3(messages: Sequence[ChatMessage], tools: Sequence[Tool], today: dt.date) -> list[str]:
    if tools or any(m.tool_calls for m in messages):
        raise TemplateError("the Llama 3 template has no tool support (llama-server would add its own polyfill)")
    segments = [_LLAMA_HEADER.format(role=m.role) + _trim(m.content) + _LLAMA_EOT for m in messages]
    segments.append(_LLAMA_HEADER.format(role="assistant"))
    return segments


_CHATML_SOURCE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)


def _render_chatml(messages: Sequence[ChatMessage], tools: Sequence[Tool], today: dt.date) -> list[str]:
    if tools or any(m.tool_calls for m in messages):
        raise TemplateError("the built-in chatml template has no tool support (llama-server adds a polyfill)")
    segments = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages]
    segments.append("<|im_start|>assistant\n")
    return segments


_RENDERERS: dict[str, Renderer] = {
    "llama3.1": _render_llama31,
    "llama3": _render_llama3,
    "chatml": _render_chatml,
}
