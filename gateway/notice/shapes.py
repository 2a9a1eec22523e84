"""Where each route's reply carries its text, whole and streamed, and which requests get no notice at all (pure).

    shape              whole reply (JSON)                         stream event with text (first non-empty one)
    ollama_chat        message.content                            NDJSON line, message.content
    ollama_generate    response                                   NDJSON line, response
    openai_chat        choices[].message.content                  SSE chunk, choices[].delta.content
    openai_completion  choices[].text                             SSE chunk, choices[].text
    responses          output[type=message].content[output_text]  SSE response.output_text.delta (and the .done
                                                                  events, output_item.done, response.completed)
    anthropic          content[type=text].text (the first)        SSE content_block_delta with a text_delta
    llama_completion   content (each result of a batch)           SSE data, content

The rule. The notice goes in front of the reply's first text, in every choice of a reply with several. A reply
with no text (tool calls only, or empty) gets none: a line there would be a text the client's tool-call parser
does not expect. A request gets none when its reply is not prose for a person to read: infill and fill-in-the-middle
(``suffix``: the reply is spliced into code), a raw prompt (the client does its own templating), and structured
output (Ollama's ``format``, OpenAI's ``response_format`` other than text, the Responses ``text.format``, llama-server's
``json_schema`` and ``grammar``, Anthropic's ``output_format``), whose reply a program parses.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from gateway.domain import Dialect, Operation, ParsedRequest


class Shape(StrEnum):
    OLLAMA_CHAT = "ollama_chat"
    OLLAMA_GENERATE = "ollama_generate"
    OPENAI_CHAT = "openai_chat"
    OPENAI_COMPLETION = "openai_completion"
    RESPONSES = "responses"
    ANTHROPIC = "anthropic"
    LLAMA_COMPLETION = "llama_completion"


_SHAPES = {
    (Dialect.OLLAMA, Operation.CHAT): Shape.OLLAMA_CHAT,
    (Dialect.OLLAMA, Operation.GENERATE): Shape.OLLAMA_GENERATE,
    (Dialect.OPENAI, Operation.CHAT): Shape.OPENAI_CHAT,
    (Dialect.OPENAI, Operation.GENERATE): Shape.OPENAI_COMPLETION,
    (Dialect.OPENAI, Operation.RESPONSES): Shape.RESPONSES,
    (Dialect.ANTHROPIC, Operation.CHAT): Shape.ANTHROPIC,
    (Dialect.LLAMACPP, Operation.GENERATE): Shape.LLAMA_COMPLETION,
}
_PLAIN_FORMATS = (None, "text")


def shape_of(parsed: ParsedRequest) -> Shape | None:
    return _SHAPES.get((parsed.dialect, parsed.operation))


def _format_type(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else value


def withheld(parsed: ParsedRequest) -> str | None:
    """Why this request's reply gets no notice (see the module docstring), or None."""
    body = parsed.body
    if parsed.operation is Operation.INFILL or body.get("suffix") or body.get("input_suffix"):
        return "fill-in-the-middle: the reply is spliced into code"
    if body.get("raw") is True:
        return "a raw prompt"
    text = body.get("text")
    structured = (
        body.get("format") if parsed.dialect is Dialect.OLLAMA else None,
        _format_type(body.get("response_format")) not in _PLAIN_FORMATS,
        isinstance(text, dict) and _format_type(text.get("format")) not in _PLAIN_FORMATS,
        body.get("json_schema") is not None, body.get("grammar"), body.get("output_format") is not None,
    )
    return "structured output: a program parses the reply" if any(structured) else None


def _prefix(holder: Any, key: str, line: str) -> bool:
    """Put ``line`` in front of ``holder[key]`` when that is a non-empty string."""
    if isinstance(holder, dict) and isinstance(holder.get(key), str) and holder[key]:
        holder[key] = line + holder[key]
        return True
    return False


def _choices(body: dict[str, Any]) -> list[Any]:
    choices = body.get("choices")
    return choices if isinstance(choices, list) else []


def add_to_reply(shape: Shape, body: Any, line: str) -> bool:
    """Put ``line`` in front of the whole reply's first text (in place); whether it found one."""
    if shape is Shape.LLAMA_COMPLETION and isinstance(body, list):  # a batch: one result per prompt
        return any([add_to_reply(shape, result, line) for result in body])
    if not isinstance(body, dict):
        return False
    if shape is Shape.OLLAMA_CHAT:
        return _prefix(body.get("message"), "content", line)
    if shape is Shape.OLLAMA_GENERATE:
        return _prefix(body, "response", line)
    if shape is Shape.OPENAI_CHAT:
        return any([_prefix(choice.get("message"), "content", line) for choice in _choices(body)
                    if isinstance(choice, dict)])
    if shape is Shape.OPENAI_COMPLETION:
        return any([_prefix(choice, "text", line) for choice in _choices(body)])
    if shape is Shape.RESPONSES:
        return _add_to_response(body, line)
    if shape is Shape.ANTHROPIC:
        blocks = body.get("content")
        return isinstance(blocks, list) and any(
            _prefix(block, "text", line) for block in blocks if isinstance(block, dict) and block.get("type") == "text")
    return _prefix(body, "content", line)


def first_text_part(response: dict[str, Any]) -> tuple[str, int] | None:
    """(item id, content index) of a Responses object's first non-empty output_text."""
    output = response.get("output")
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict) or item.get("type") != "message" or not isinstance(item.get("content"), list):
            continue
        for index, part in enumerate(item["content"]):
            if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str) \
                    and part["text"]:
                return str(item.get("id")), index
    return None


def add_to_part(response: Any, item_id: str, index: int, line: str) -> bool:
    """Put ``line`` in front of the text of one output_text part of a Responses object."""
    output = response.get("output") if isinstance(response, dict) else None
    for item in output if isinstance(output, list) else ():
        if isinstance(item, dict) and str(item.get("id")) == item_id and isinstance(item.get("content"), list) \
                and 0 <= index < len(item["content"]):
            return _prefix(item["content"][index], "text", line)
    return False


def _add_to_response(body: dict[str, Any], line: str) -> bool:
    found = first_text_part(body)
    if found is None:
        return False
    added = add_to_part(body, *found, line)
    _prefix(body, "output_text", line)  # a convenience field some servers add
    return added
