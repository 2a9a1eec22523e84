"""llama-server's own count: exact by construction (its template, its tokenizer, its special tokens).

    chat  POST /v1/chat/completions/input_tokens {messages, tools, model}  -> {"input_tokens": N}
    text  POST /tokenize {content, add_special, parse_special: true}       -> {"tokens": [...]}

One HTTP round trip per count, so this is the first counter for llama-server backends and the GGUF path is the
fallback when the server is busy loading, unreachable, or too old to have the input_tokens route.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from gateway.tokens.count import CounterUnavailable, Message, TokenCount, Tool
from gateway.tokens.templates import detect_template
from gateway.tokens.text import ByteText, decode_text


async def probe_chat_template(
    session: aiohttp.ClientSession, base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0
) -> str | None:
    """The chat-template family (templates.detect_template) a llama-server renders with, from GET /props.

    None when the server is unreachable or uses a template not rendered in Python; the GGUF fallback then counts
    message contents instead of the exact template.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = base_url.rstrip("/") + "/props"
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status != 200:
                return None
            props = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    source = props.get("chat_template") if isinstance(props, dict) else None
    return detect_template(source) if isinstance(source, str) else None


class LlamaServerCounter:
    """Asks a llama-server for the exact prompt length."""

    name = "llama-server"

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    def __repr__(self) -> str:
        return f"LlamaServerCounter({self.base_url!r}, model={self.model!r})"  # never the API key

    async def count_chat(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> TokenCount:
        body: dict[str, Any] = {"messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        if self.model:
            body["model"] = self.model
        reply = await self._post("/v1/chat/completions/input_tokens", body)
        tokens = reply.get("input_tokens")
        if not isinstance(tokens, int):
            raise CounterUnavailable(self.name, f"{self.base_url}: input_tokens missing in {str(reply)[:120]}")
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
            raise CounterUnavailable(self.name, f"{self.base_url}: tokens missing in /tokenize reply")
        return TokenCount(len(tokens), self.name, exact=True)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        try:
            async with self.session.post(url, json=body, headers=self._headers, timeout=self.timeout) as response:
                if response.status != 200:
                    detail = (await response.text())[:200]
                    raise CounterUnavailable(self.name, f"POST {url}: HTTP {response.status} {detail}")
                reply = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise CounterUnavailable(self.name, f"POST {url}: {exc!r}") from exc
        if not isinstance(reply, dict):
            raise CounterUnavailable(self.name, f"POST {url}: reply is not a JSON object")
        return reply
