"""Ollama: /api/show, /api/ps and /api/tags answers -> profiles and loaded models (pure, no I/O).

/api/show without ``verbose`` returns every GGUF array as null, per-layer ``head_count_kv`` included
(ollama.md 3.2); ``needs_verbose`` says when to ask again with ``{"verbose": true}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.memory.kv import ModelShape
from gateway.memory.metadata import per_layer_arrays_missing
from gateway.memory.profile import ModelProfile, ProfileSource
from gateway.memory.sources.common import (
    ProfileError,
    as_int,
    n_ff_from,
    n_vocab_from,
    quantization_name,
    tensor_bytes,
)

_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class LoadedModel:
    """One entry of /api/ps: what Ollama has in memory now."""

    name: str
    digest: str
    size_bytes: int
    size_vram_bytes: int
    context_tokens: int | None  # per-sequence num_ctx after clamping (v0.9.7+)
    expires_at: str | None
    quantization: str | None

    @property
    def offloaded_fraction(self) -> float:
        """Share of the model on the CPU (1 - size_vram/size)."""
        return 0.0 if self.size_bytes <= 0 else max(0.0, 1.0 - self.size_vram_bytes / self.size_bytes)


@dataclass(frozen=True)
class TagEntry:
    """One entry of /api/tags: a model on disk."""

    name: str
    digest: str
    size_bytes: int


def _model_info(show: Mapping[str, Any]) -> Mapping[str, Any]:
    info = show.get("model_info")
    if not isinstance(info, Mapping):
        raise ProfileError("/api/show has no model_info (a remote or non-GGUF model?); cannot size its KV cache")
    return info


def needs_verbose(show: Mapping[str, Any]) -> bool:
    """True when a per-layer array came back null: ask /api/show again with verbose=true."""
    return bool(per_layer_arrays_missing(_model_info(show)))


def modelfile_num_ctx(parameters: str | None) -> int | None:
    """num_ctx from the Modelfile PARAMETER block of /api/show (`parameters`), if set."""
    match = _NUM_CTX.search(parameters or "")
    return int(match.group(1)) if match else None


def _weights_from_tensors(show: Mapping[str, Any]) -> int | None:
    tensors = show.get("tensors")
    if not isinstance(tensors, list) or not tensors:
        return None
    return sum(tensor_bytes(str(t["type"]), [int(d) for d in t["shape"]]) for t in tensors)


@dataclass(frozen=True)
class _Embeddings:
    """What the tensor list says about the token embedding table: its bytes, its rows (the vocabulary), and whether
    the output layer shares it."""

    input_bytes: int | None = None
    n_vocab: int | None = None
    tied: bool | None = None


def _embeddings_from_tensors(show: Mapping[str, Any]) -> _Embeddings:
    tensors = show.get("tensors")
    if not isinstance(tensors, list) or not tensors:
        return _Embeddings()
    by_name = {str(t.get("name")): t for t in tensors if isinstance(t, Mapping)}
    embd = by_name.get("token_embd.weight")
    if embd is None:
        return _Embeddings(tied=None)
    shape = [int(d) for d in embd["shape"]]
    return _Embeddings(tensor_bytes(str(embd["type"]), shape), shape[-1] if len(shape) == 2 else None,
                       "output.weight" not in by_name)


def profile_from_show(
    name: str, show: Mapping[str, Any], *, size_bytes: int | None = None, digest: str = ""
) -> ModelProfile:
    """Profile from /api/show; weights from its tensor list, else the /api/tags size (``size_bytes``)."""
    info = _model_info(show)
    shape = ModelShape.from_gguf_metadata(info)
    raw_details = show.get("details")
    details: Mapping[str, Any] = raw_details if isinstance(raw_details, Mapping) else {}
    weights = _weights_from_tensors(show) or size_bytes
    warnings: tuple[str, ...] = ()
    if weights is None:
        weights = 0
        warnings = (f"Ollama gave no tensor list or size for {name}; weights are not counted",)
    capabilities = show.get("capabilities")
    parameter_count = info.get("general.parameter_count")
    embeddings = _embeddings_from_tensors(show)
    return ModelProfile(
        name=name,
        shape=shape,
        weights_bytes=weights,
        source=ProfileSource.OLLAMA,
        quantization=details.get("quantization_level") or quantization_name(info.get("general.file_type")),
        context_tokens=modelfile_num_ctx(show.get("parameters")),
        capabilities=tuple(str(c) for c in capabilities) if isinstance(capabilities, list) else (),
        parameter_count=parameter_count if isinstance(parameter_count, int) else None,
        n_vocab=n_vocab_from(info) or embeddings.n_vocab,
        n_ff=n_ff_from(info),
        cache_key=f"ollama:{digest or show.get('modified_at', '')}",
        input_embedding_bytes=embeddings.input_bytes,
        tied_embeddings=embeddings.tied,
        has_projector=bool(show.get("projector_info")),
        warnings=warnings,
    )


def parse_ps(ps: Mapping[str, Any]) -> list[LoadedModel]:
    """Loaded models from /api/ps."""
    models = ps.get("models")
    if not isinstance(models, list):
        raise ProfileError("/api/ps answer has no 'models' list")
    loaded = []
    for entry in models:
        raw_details = entry.get("details")
        details: Mapping[str, Any] = raw_details if isinstance(raw_details, Mapping) else {}
        context = entry.get("context_length")
        loaded.append(
            LoadedModel(
                name=str(entry.get("name") or entry.get("model")),
                digest=str(entry.get("digest", "")),
                size_bytes=as_int(entry.get("size"), "/api/ps size"),
                size_vram_bytes=as_int(entry.get("size_vram", 0), "/api/ps size_vram"),
                context_tokens=context if isinstance(context, int) and context > 0 else None,
                expires_at=entry.get("expires_at"),
                quantization=details.get("quantization_level"),
            )
        )
    return loaded


def parse_tags(tags: Mapping[str, Any]) -> dict[str, TagEntry]:
    """Models on disk from /api/tags, by name (and by model, which may differ)."""
    models = tags.get("models")
    if not isinstance(models, list):
        raise ProfileError("/api/tags answer has no 'models' list")
    entries: dict[str, TagEntry] = {}
    for entry in models:
        tag = TagEntry(
            name=str(entry.get("name")),
            digest=str(entry.get("digest", "")),
            size_bytes=as_int(entry.get("size", 0), "/api/tags size"),
        )
        entries[tag.name] = tag
        entries.setdefault(str(entry.get("model", tag.name)), tag)
    return entries


def default_context_tokens(total_vram_bytes: int, n_ctx_train: int | None) -> int:
    """The context Ollama (v0.15.5+, ``OLLAMA_CONTEXT_LENGTH`` unset) loads a model with when nothing names one: a
    tier of the GPUs' total VRAM (>= 47 GiB: 262144, >= 23 GiB: 32768, else 4096), at most the model's n_ctx_train
    (facts/ollama.md, OLLAMA_CONTEXT_LENGTH)."""
    gib = 2**30
    tier = 262144 if total_vram_bytes >= 47 * gib else 32768 if total_vram_bytes >= 23 * gib else 4096
    return min(tier, n_ctx_train) if n_ctx_train else tier
