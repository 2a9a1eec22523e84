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
    RESPONSES = "responses"
    INFILL = "infill"
    EMBED = "embed"
    RERANK = "rerank"
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


FieldPath = tuple[str, ...]
"""Where a field sits in a JSON body: ``("options", "num_predict")``."""

KV_OPERATIONS = frozenset({Operation.CHAT, Operation.GENERATE, Operation.RESPONSES, Operation.INFILL})
"""Operations whose requests allocate KV cells for a sequence (a prompt and its output)."""
NO_OUTPUT_OPERATIONS = frozenset({Operation.EMBED, Operation.RERANK})
"""Operations that run their inputs and generate nothing: each input holds a slot (and, on llama-server, the KV cells
of its tokens) while it runs, and no output is reserved for it."""


@dataclass(frozen=True, slots=True)
class OutputLimit:
    """Where a body carries its output limit and what it asks for, read by the dialect that owns the body.

    ``tokens`` is the most a backend may generate per sequence under this body: the largest value among the limit
    fields present (each backend obeys a different one: llama-server takes ``n_predict`` before
    ``max_completion_tokens`` before ``max_tokens``, Ollama's /v1 only ``max_tokens``), None when no field is present
    or any is negative (-1 means "no limit" to Ollama and llama-server). ``fields`` lists every limit field present;
    ``write_to`` is the field every backend of the route reads, written when the body has none.
    """

    tokens: int | None = None
    fields: tuple[FieldPath, ...] = ()
    write_to: FieldPath = ("max_tokens",)


@dataclass(frozen=True, slots=True)
class Prompt:
    """What a backend turns into prompt tokens, normalized by the dialect: a chat (the messages its template sees,
    system prompts included, and OpenAI-shaped tools) or a text prompt (a string, token ids, a mix, or a list of
    them). ``exact_shape`` is False when the dialect could only approximate what the backend renders (infill's
    FIM tokens, Responses items it does not know): a count of it is an estimate.

    ``batch`` holds the prompts of a request the backend runs as several tasks, one sequence each (a multi-prompt
    completion ``"prompt": [a, b, c]``, an embedding of a list of inputs, a rerank's documents), each counted on its
    own; empty for a request of one prompt. ``extra_tokens`` are tokens the backend adds that the text does not show
    (the separators llama-server puts between a rerank's query and document)."""

    messages: tuple[dict[str, Any], ...] | None = None
    text: Any = None
    tools: tuple[dict[str, Any], ...] = ()
    exact_shape: bool = True
    batch: tuple[Prompt, ...] = ()
    extra_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated request body: the fields later stages read, plus the original JSON.

    ``messages`` is the body's own ``messages`` array (what trimming may shorten); ``prompt_input`` is what the
    backend will tokenize, in one shape for every dialect; ``num_ctx_field`` is where the body can carry a context
    size (Ollama's native routes only); ``sequences`` is how many completions the client asks for per prompt
    (``n``), whether or not the backend runs them (``admission.sequence_rules``); ``allocates_kv`` says the request
    runs sequences on the backend (a prompt, an embedding input), so it is routed and admitted.
    """

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
    prompt_input: Prompt = Prompt()
    output: OutputLimit = OutputLimit()
    num_ctx_field: FieldPath | None = None
    sequences: int = 1
    allocates_kv: bool = False


@dataclass(frozen=True, slots=True)
class Rewrites:
    """Fields the proxy must rewrite in the body before forwarding; None leaves the field as the client sent it. The
    planner decides them (``admission.Admit.rewrites``), fitting writes them (gateway/fitting/rewrite.py): the one
    word both share, so it lives below both."""

    num_ctx: int | None = None
    max_output_tokens: int | None = None

    def __bool__(self) -> bool:
        return self.num_ctx is not None or self.max_output_tokens is not None
