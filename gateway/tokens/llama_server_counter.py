"""llama-server's own count: exact by construction (its template, its tokenizer, its special tokens).

    chat  POST /v1/chat/completions/input_tokens {messages, tools, model}  -> {"input_tokens": N}
    text  POST /tokenize {content, add_special, parse_special: true}       -> {"tokens": [...]}

One HTTP round trip per count, so this is the first counter for llama-server backends and the GGUF path is the
fallback when the server is busy loading, unreachable, or too old to have the input_tokens route.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.backends.client import BackendCallError, BackendClient
from gateway.tokens.count import CounterUnavailable, Message, TokenCount, Tool
from gateway.tokens.countable_text import ByteText, decode_text
from gateway.tokens.templates import detect_template


async def probe_chat_template(client: BackendClient, *, timeout_s: float = 10.0) -> str | None:
    """The chat-template family (templates.detect_template) a llama-server renders with, from GET /props.

    None when the server is unreachable or uses a template not rendered in Python; the GGUF fallback then counts
    message contents instead of the exact template.
    """
    try:
        props = await client.get_json("/props", timeout_s=timeout_s)
    except BackendCallError:
        return None
    source = props.get("chat_template")
    return detect_template(source) if isinstance(source, str) else None


class LlamaServerCounter:
    """Asks a llama-server for the exact prompt length."""

    name = "llama-server"

    def __init__(self, client: BackendClient, *, model: str | None = None, timeout_s: float = 10.0) -> None:
        self.client = client
        self.model = model
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"LlamaServerCounter({self.client.label!r}, model={self.model!r})"  # never the API key

    async def count_chat(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> TokenCount:
        body: dict[str, Any] = {"messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        if self.model:
            body["model"] = self.model
        reply = await self._post("/v1/chat/completions/input_tokens", body)
        tokens = reply.get("input_tokens")
        if not isinstance(tokens, int):
            raise CounterUnavailable(self.name, f"{self.client.label}: input_tokens missing in {str(reply)[:120]}")
        return TokenCount(tokens, self.name, exact=True)

    async def count_text(self, text: str | bytes, *, add_special: bool = True) -> TokenCount:
        decoded = decode_text(text)
        if isinstance(decoded, ByteText):
            return TokenCount(decoded.n_bytes, f"{self.name}/bytes", exact=False)
        body: dict[str, Any] = {"content": decoded, "add_special": add_special, "parse_special": True}
        if self.model:
            body["model"] = self.model
        reply = await self._post("/tokenize", body)
        tokens = reply.get("tokens")
        if not isinstance(tokens, list):
            raise CounterUnavailable(self.name, f"{self.client.label}: tokens missing in /tokenize reply")
        return TokenCount(len(tokens), self.name, exact=True)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.client.post_json(path, body, timeout_s=self.timeout_s)
        except BackendCallError as exc:
            raise CounterUnavailable(self.name, exc.message) from exc
