"""ModelProfile: what kvgate knows about one model, whichever source it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gateway.memory.kv import ModelShape


class ProfileSource(StrEnum):
    OLLAMA = "ollama"
    LLAMA_SERVER = "llama-server"
    GGUF = "gguf"
    PRESET = "preset"


@dataclass(frozen=True)
class ModelProfile:
    """Shape plus the facts that decide a model's load cost.

    ``context_tokens`` is the per-sequence context the model is configured or loaded with (Ollama's num_ctx or
    /api/ps context_length, llama-server's per-slot n_ctx); None when the source does not say. ``cache_key``
    changes when the model changes (an Ollama digest, a GGUF path with its mtime).
    """

    name: str
    shape: ModelShape
    weights_bytes: int
    source: ProfileSource
    quantization: str | None = None
    context_tokens: int | None = None
    parallel: int | None = None
    capabilities: tuple[str, ...] = ()
    parameter_count: int | None = None
    n_vocab: int | None = None
    n_ff: int | None = None
    cache_key: str = ""
    input_embedding_bytes: int | None = None
    """The token embedding table (``token_embd.weight``), which llama.cpp keeps in host memory; None when the source
    lists no tensors."""
    tied_embeddings: bool | None = None
    """True when the output layer is the token embedding table (no ``output.weight``): llama.cpp then puts a copy of
    it on the GPU. None when the source lists no tensors."""
    has_projector: bool = False
    """A separate image projector file (Ollama's /api/show ``projector_info``) is loaded beside the model."""
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def embedding_only(self) -> bool:
        """An embedding model: it can embed and not complete (Ollama's ``/api/show`` capabilities)."""
        return "embedding" in self.capabilities and "completion" not in self.capabilities

    @property
    def all_warnings(self) -> tuple[str, ...]:
        return self.shape.warnings + self.warnings
