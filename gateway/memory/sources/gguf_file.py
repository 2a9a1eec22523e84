"""A GGUF file on disk -> ModelProfile (metadata only; tensors are never loaded)."""

from __future__ import annotations

from pathlib import Path

from gateway.memory.kv import ModelShape
from gateway.memory.profile import ModelProfile, ProfileSource
from gateway.memory.sources.common import n_ff_from, n_vocab_from, quantization_name
from gateway.support.gguf_reader import GgufSummary, read_gguf


def profile_from_summary(summary: GgufSummary) -> ModelProfile:
    metadata = summary.metadata
    name = metadata.get("general.name")
    parameter_count = metadata.get("general.parameter_count")
    return ModelProfile(
        name=str(name) if name else summary.path.stem,
        shape=ModelShape.from_gguf_metadata(metadata),
        weights_bytes=summary.weights_bytes,
        source=ProfileSource.GGUF,
        quantization=quantization_name(metadata.get("general.file_type")),
        parameter_count=parameter_count if isinstance(parameter_count, int) else None,
        n_vocab=n_vocab_from(metadata),
        n_ff=n_ff_from(metadata),
        cache_key=f"gguf:{summary.path}:{summary.mtime_ns}",
    )


def profile_from_gguf(path: str | Path) -> ModelProfile:
    return profile_from_summary(read_gguf(path))
