"""Turning request content into countable text without ever failing on odd input.

Request bodies are parsed JSON, so content is normally `str`; but raw prompts can arrive as bytes, message
content can be a list of parts (OpenAI/Anthropic), and tool arguments can be objects or strings. Bytes that are not
valid UTF-8 cannot be tokenized faithfully, so they are counted by length instead (`ByteText`), never raised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class ByteText:
    """Content that is not valid UTF-8: only its length in bytes is known."""

    n_bytes: int


def decode_text(value: str | bytes) -> str | ByteText:
    """str as is; bytes decoded as UTF-8, or ByteText when they are not valid UTF-8."""
    if isinstance(value, str):
        if _has_lone_surrogates(value):
            return ByteText(len(value.encode("utf-8", errors="surrogatepass")))
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return ByteText(len(value))


def _has_lone_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def content_text(content: Any, *, separator: str = "\n") -> str:
    """The text of a message's content: a string, or the text parts of a list of parts joined by `separator`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        texts = [_part_text(part) for part in content]
        return separator.join(t for t in texts if t is not None)
    if isinstance(content, bytes | bytearray):
        decoded = decode_text(bytes(content))
        return decoded if isinstance(decoded, str) else ""
    return json_text(content)


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind in (None, "text", "input_text", "output_text") and isinstance(part.get("text"), str):
            return str(part["text"])
    return None


def count_content_images(content: Any) -> int:
    """Images in an OpenAI/Anthropic list of parts (Ollama lists them under the message's `images`)."""
    if isinstance(content, str) or not isinstance(content, list | tuple):  # JSON gives a list; a str is the usual
        return 0
    return sum(
        1 for part in content if isinstance(part, Mapping) and part.get("type") in ("image_url", "image", "input_image")
    )


def json_text(value: Any) -> str:
    """Compact JSON of a value (tool schemas, tool-call arguments); never raises."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return str(value)
