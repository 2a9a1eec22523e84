"""An OpenAI-compatible server's own count, where it has one: exact by construction (its template, its tokenizer).

    vLLM          POST /tokenize {"model", "messages", "tools"}   -> {"count", "max_model_len", "tokens"}
                  POST /tokenize {"model", "prompt", "add_special_tokens"}
    llama-server  POST /v1/chat/completions/input_tokens (chats), /tokenize {"content"} (text): LlamaServerCounter
    neither       404, 405 or 501, or an answer of neither shape: the chain goes on (tokenizer.json, tiktoken, the
                  estimate), quietly, without asking again

Which one a backend has is probed once per backend (``TokenizeEndpoints``, shared by every model's chain on it): one
``POST /tokenize {"prompt": "kvgate"}`` naming no model (vLLM then uses its served model). vLLM answers ``count``;
llama-server reads only ``content``, so it answers ``{"tokens": []}``; anything else has no such route. A probe that
fails otherwise (the backend down, a 5xx, a timeout) decides nothing: the next count probes again. vLLM's answer
also says its ``max_model_len``: a configured ``context_tokens`` above it is logged (kvgate would admit prompts the
server refuses).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from gateway.backends.client import BackendCallError, BackendClient, BackendStatusError
from gateway.tokens.count import CounterUnavailable, Message, TokenCount, Tool
from gateway.tokens.countable_text import ByteText, decode_text
from gateway.tokens.llama_server_counter import LlamaServerCounter

NO_ROUTE_STATUSES = frozenset({404, 405, 501})
"""Statuses that mean "no such endpoint here": remembered, and the chain falls back quietly."""
PROBE_TEXT = "kvgate"
log = logging.getLogger(__name__)


class TokenizeFlavor(StrEnum):
    VLLM = "vllm"
    LLAMA_SERVER = "llama-server"
    NONE = "none"


class TokenizeEndpoints:
    """Which tokenize endpoint one backend has, probed once (concurrent first counts share the probe)."""

    def __init__(
        self, client: BackendClient, *, timeout_s: float = 10.0, context_tokens: int | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._context_tokens = context_tokens
        """The backend's configured ``context_tokens``, checked against vLLM's ``max_model_len``."""
        self._log = logger
        self.flavor: TokenizeFlavor | None = None
        """None until a probe decided."""
        self.max_model_len: int | None = None
        """vLLM's own context (``max_model_len`` of its /tokenize answer), once probed."""
        self._probing: asyncio.Future[TokenizeFlavor] | None = None

    async def detect(self) -> TokenizeFlavor:
        """The backend's flavor; CounterUnavailable when the probe could not decide (asked again next time)."""
        if self.flavor is not None:
            return self.flavor
        if self._probing is None or self._probing.done():
            self._probing = asyncio.ensure_future(self._probe())
        return await asyncio.shield(self._probing)

    async def _probe(self) -> TokenizeFlavor:
        try:
            reply = await self.client.post_json("/tokenize", {"prompt": PROBE_TEXT}, timeout_s=self.timeout_s)
        except BackendStatusError as exc:
            if exc.backend_status not in NO_ROUTE_STATUSES:
                raise CounterUnavailable(BackendTokenizeCounter.name, exc.message) from exc
            self.flavor = TokenizeFlavor.NONE
            return self.flavor
        except BackendCallError as exc:  # down, timed out, not JSON: nothing learned
            raise CounterUnavailable(BackendTokenizeCounter.name, exc.message) from exc
        if isinstance(reply.get("count"), int):
            self.flavor = TokenizeFlavor.VLLM
            length = reply.get("max_model_len")
            self.max_model_len = length if isinstance(length, int) and length > 0 else None
            if self.max_model_len is not None and (self._context_tokens or 0) > self.max_model_len:
                self._log.warning("%s has context_tokens = %d, but the server's max_model_len is %d: kvgate admits "
                                  "prompts the server refuses; set context_tokens = %d", self.client.label,
                                  self._context_tokens, self.max_model_len, self.max_model_len)
        elif isinstance(reply.get("tokens"), list):
            self.flavor = TokenizeFlavor.LLAMA_SERVER
        else:
            self.flavor = TokenizeFlavor.NONE
        return self.flavor


class BackendTokenizeCounter:
    """Asks an OpenAI-compatible server for the exact prompt length, through the endpoint it has."""

    name = "backend"

    def __init__(self, endpoints: TokenizeEndpoints, *, model: str | None = None, timeout_s: float = 10.0) -> None:
        self.endpoints = endpoints
        self.model = model
        self.timeout_s = timeout_s
        self._llama = LlamaServerCounter(endpoints.client, model=model, timeout_s=timeout_s)

    def __repr__(self) -> str:
        return f"BackendTokenizeCounter({self.endpoints.client.label!r}, model={self.model!r})"  # never the key

    async def count_chat(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> TokenCount:
        flavor = await self._flavor()
        if flavor is TokenizeFlavor.LLAMA_SERVER:
            return await self._llama.count_chat(messages, tools)
        body: dict[str, Any] = {"messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        return await self._vllm(body)

    async def count_text(self, text: str | bytes, *, add_special: bool = True) -> TokenCount:
        flavor = await self._flavor()
        if flavor is TokenizeFlavor.LLAMA_SERVER:
            return await self._llama.count_text(text, add_special=add_special)
        decoded = decode_text(text)
        if isinstance(decoded, ByteText):
            return TokenCount(decoded.n_bytes, f"{TokenizeFlavor.VLLM.value}/bytes", exact=False)
        return await self._vllm({"prompt": decoded, "add_special_tokens": add_special})

    async def _flavor(self) -> TokenizeFlavor:
        flavor = await self.endpoints.detect()
        if flavor is TokenizeFlavor.NONE:
            raise CounterUnavailable(self.name, f"{self.endpoints.client.label} has no tokenize endpoint (vLLM's "
                                     "/tokenize or llama-server's)", quiet=True)
        return flavor

    async def _vllm(self, body: dict[str, Any]) -> TokenCount:
        if self.model:
            body["model"] = self.model
        try:
            reply = await self.endpoints.client.post_json("/tokenize", body, timeout_s=self.timeout_s)
        except BackendCallError as exc:
            raise CounterUnavailable(self.name, exc.message) from exc
        count = reply.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise CounterUnavailable(self.name, f"{self.endpoints.client.label}: count missing in /tokenize reply "
                                     f"{str(reply)[:120]}")
        return TokenCount(count, TokenizeFlavor.VLLM.value, exact=True)
