"""The last counter of every chain: UTF-8 bytes divided by a bytes-per-token ratio, plus a safety margin.

It never fails and never touches the network, so admission always has a number; it is flagged `exact=False`
so the planner can keep a margin. Defaults lean high: English runs about 4 bytes per token on Llama-3-sized
vocabularies, code about 3, so 3 bytes per token plus 10% over-counts most text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.tokens.count import Message, TokenCount, Tool
from gateway.tokens.countable_text import content_text, count_content_images, json_text


def utf8_length(text: str | bytes) -> int:
    if isinstance(text, bytes):
        return len(text)
    if text.isascii():  # one byte a character, known without a copy (a 20 MiB prompt is not encoded to measure it)
        return len(text)
    return len(text.encode("utf-8", errors="surrogatepass"))


class EstimateCounter:
    """Byte-length estimate with a configurable ratio, margin and per-message/per-request overheads."""

    name = "estimate"

    def __init__(
        self,
        *,
        bytes_per_token: float = 3.0,
        safety_margin: float = 0.10,
        per_message_tokens: int = 8,
        per_request_tokens: int = 16,
        image_tokens: int = 768,
    ) -> None:
        if bytes_per_token <= 0:
            raise ValueError(f"bytes_per_token must be positive, got {bytes_per_token}")
        self.bytes_per_token = bytes_per_token
        self.safety_margin = safety_margin
        self.per_message_tokens = per_message_tokens
        self.per_request_tokens = per_request_tokens
        self.image_tokens = image_tokens

    def tokens_for_bytes(self, n_bytes: int) -> int:
        return math.ceil(n_bytes / self.bytes_per_token * (1.0 + self.safety_margin))

    async def count_text(self, text: str | bytes, *, add_special: bool = True) -> TokenCount:
        tokens = self.tokens_for_bytes(utf8_length(text)) + (1 if add_special else 0)
        return TokenCount(tokens, self.name, exact=False)

    async def count_chat(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> TokenCount:
        n_bytes = 0
        images = 0
        for message in messages:
            content = message.get("content")
            n_bytes += utf8_length(content_text(content))
            images += count_content_images(content) + len(message.get("images") or ())
            for call in message.get("tool_calls") or ():
                n_bytes += utf8_length(json_text(call))
        n_bytes += sum(utf8_length(json_text(tool)) for tool in tools)
        tokens = (
            self.tokens_for_bytes(n_bytes)
            + self.per_message_tokens * len(messages)
            + self.per_request_tokens
            + self.image_tokens * images
        )
        return TokenCount(tokens, self.name, exact=False)
