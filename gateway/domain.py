"""Frozen, dialect-neutral data that flows along the request path.

A request is parsed once at the edge into a :class:`ParsedRequest`. The original body is kept byte for byte, so a
request the gateway does not change is forwarded exactly as the client sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Dialect(StrEnum):
    """The API a client speaks on a route; decides how errors are rendered."""

    OLLAMA = "ollama"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    LLAMACPP = "llama-server"


class Operation(StrEnum):
    """What a route does, independent of dialect."""

    CHAT = "chat"
    GENERATE = "generate"
    EMBED = "embed"
    TOKENIZE = "tokenize"
    COUNT = "count"
    MODEL_INFO = "model_info"
    LIST_MODELS = "list_models"
    MANAGE = "manage"
    OTHER = "other"


class BackendKind(StrEnum):
    """The kind of server a backend is; decides how its models are listed and probed."""

    OLLAMA = "ollama"
    LLAMA_SERVER = "llama-server"
    OPENAI = "openai"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated request body: the fields later stages read, plus the original JSON."""

    dialect: Dialect
    operation: Operation
    model: str | None
    stream: bool
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    num_ctx_tokens: int | None = None
    max_output_tokens: int | None = None
    tools: tuple[dict[str, Any], ...] = ()
    body: dict[str, Any] = field(default_factory=dict)
