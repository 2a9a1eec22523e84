"""The route table: every path kvgate knows, the dialect its clients speak and how it is handled.

``parsed`` routes have a JSON body that is validated (and later counted and planned); the rest stream their body
through untouched (``/api/blobs`` uploads can be gigabytes). ``listing`` routes merge the answers of all backends.
Any path not listed here goes to the default backend unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.domain import BackendKind, Dialect, Operation


class Handling(StrEnum):
    PARSED = "parsed"
    PASSTHROUGH = "passthrough"
    LISTING = "listing"


@dataclass(frozen=True, slots=True)
class Route:
    methods: tuple[str, ...]
    path: str
    dialect: Dialect
    operation: Operation
    handling: Handling
    kind: BackendKind | None = None
    """The kind of server that owns the route, when the request names no model."""


def _r(methods: str, path: str, dialect: Dialect, operation: Operation, handling: Handling,
       kind: BackendKind | None = None) -> Route:
    return Route(tuple(methods.split("|")), path, dialect, operation, handling, kind)


_O, _A, _L = Dialect.OLLAMA, Dialect.OPENAI, Dialect.LLAMACPP
_P, _T, _M = Handling.PARSED, Handling.PASSTHROUGH, Handling.LISTING
_OK, _LK = BackendKind.OLLAMA, BackendKind.LLAMA_SERVER

ROUTES: tuple[Route, ...] = (
    # Ollama
    _r("POST", "/api/chat", _O, Operation.CHAT, _P, _OK),
    _r("POST", "/api/generate", _O, Operation.GENERATE, _P, _OK),
    _r("POST", "/api/embed", _O, Operation.EMBED, _P, _OK),
    _r("POST", "/api/embeddings", _O, Operation.EMBED, _P, _OK),
    _r("POST", "/api/show", _O, Operation.MODEL_INFO, _P, _OK),
    _r("GET|HEAD", "/api/tags", _O, Operation.LIST_MODELS, _M),
    _r("GET", "/api/ps", _O, Operation.LIST_MODELS, _M, _OK),
    _r("GET|HEAD", "/api/version", _O, Operation.OTHER, _T, _OK),
    _r("POST", "/api/pull", _O, Operation.MANAGE, _T, _OK),
    _r("POST", "/api/push", _O, Operation.MANAGE, _T, _OK),
    _r("POST", "/api/create", _O, Operation.MANAGE, _T, _OK),
    _r("POST", "/api/copy", _O, Operation.MANAGE, _T, _OK),
    _r("DELETE", "/api/delete", _O, Operation.MANAGE, _T, _OK),
    _r("POST|HEAD", "/api/blobs/{digest}", _O, Operation.MANAGE, _T, _OK),
    _r("GET|HEAD", "/", _O, Operation.OTHER, _T),
    # OpenAI (and Anthropic Messages)
    _r("POST", "/v1/chat/completions", _A, Operation.CHAT, _P),
    _r("POST", "/v1/completions", _A, Operation.GENERATE, _P),
    _r("POST", "/v1/embeddings", _A, Operation.EMBED, _P),
    _r("POST", "/v1/responses", _A, Operation.RESPONSES, _P),
    _r("POST", "/v1/messages", Dialect.ANTHROPIC, Operation.CHAT, _P),
    _r("GET", "/v1/models", _A, Operation.LIST_MODELS, _M),
    _r("GET", "/v1/models/{model:.+}", _A, Operation.MODEL_INFO, _T),
    # llama-server native, and its unprefixed aliases of the OpenAI routes
    _r("POST", "/completion", _L, Operation.GENERATE, _P, _LK),
    _r("POST", "/completions", _L, Operation.GENERATE, _P, _LK),
    _r("POST", "/infill", _L, Operation.INFILL, _P, _LK),
    _r("POST", "/embedding", _L, Operation.EMBED, _P, _LK),
    _r("POST", "/embeddings", _L, Operation.EMBED, _P, _LK),
    _r("POST", "/rerank", _L, Operation.RERANK, _P, _LK),
    _r("POST", "/reranking", _L, Operation.RERANK, _P, _LK),
    _r("POST", "/v1/rerank", _L, Operation.RERANK, _P, _LK),
    _r("POST", "/v1/reranking", _L, Operation.RERANK, _P, _LK),
    _r("POST", "/chat/completions", _A, Operation.CHAT, _P, _LK),
    _r("POST", "/responses", _A, Operation.RESPONSES, _P, _LK),
    _r("POST", "/chat/completions/input_tokens", _L, Operation.COUNT, _P, _LK),
    _r("POST", "/v1/responses/input_tokens", _A, Operation.OTHER, _T, _LK),
    _r("POST", "/v1/messages/count_tokens", Dialect.ANTHROPIC, Operation.OTHER, _T, _LK),
    _r("POST", "/tokenize", _L, Operation.TOKENIZE, _P, _LK),
    _r("POST", "/detokenize", _L, Operation.TOKENIZE, _P, _LK),
    _r("POST", "/apply-template", _L, Operation.COUNT, _P, _LK),
    _r("POST", "/v1/chat/completions/input_tokens", _L, Operation.COUNT, _P, _LK),
    _r("GET", "/props", _L, Operation.OTHER, _T, _LK),
    _r("GET", "/slots", _L, Operation.OTHER, _T, _LK),
    _r("GET", "/lora-adapters", _L, Operation.OTHER, _T, _LK),
    _r("GET", "/health", _L, Operation.OTHER, _T, _LK),
    # llama-server routes that change the server for everyone: a slot restored from a file fills KV cells that no
    # reservation counts, an erase drops other tenants' prompt caches, adapters and properties change every answer
    _r("POST", "/props", _L, Operation.MANAGE, _T, _LK),
    _r("POST", "/slots/{id_slot}", _L, Operation.MANAGE, _T, _LK),
    _r("POST", "/lora-adapters", _L, Operation.MANAGE, _T, _LK),
    _r("POST", "/models", _L, Operation.MANAGE, _T, _LK),
    _r("POST", "/models/load", _L, Operation.MANAGE, _T, _LK),
    _r("POST", "/models/unload", _L, Operation.MANAGE, _T, _LK),
)

FALLBACK = Route(("*",), "/{tail:.*}", Dialect.OPENAI, Operation.OTHER, Handling.PASSTHROUGH)
"""Unknown paths: to the default backend, errors rendered as OpenAI's (the most common client)."""


def fallback_dialect(path: str) -> Dialect:
    """Pick the error dialect of an unlisted path from its prefix."""
    if path.startswith("/api/"):
        return Dialect.OLLAMA
    if path.startswith("/v1/"):
        return Dialect.OPENAI
    return Dialect.LLAMACPP
