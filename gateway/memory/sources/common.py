"""Helpers shared by the profile parsers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The gguf package (and numpy under it) is imported where it is used: ~0.15 s of `kvgate serve` startup.


class ProfileError(ValueError):
    """Raised when a source's answer cannot be turned into a model profile."""


def quantization_name(file_type: object) -> str | None:
    """'Q4_K_M' for general.file_type 15; None when absent or unknown."""
    if not isinstance(file_type, int) or isinstance(file_type, bool):
        return None
    import gguf

    try:
        name = gguf.LlamaFileType(file_type).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def tensor_bytes(ggml_type_name: str, shape: Sequence[int]) -> int:
    """Bytes of a tensor given its ggml type name ('Q4_K', 'F32') and shape."""
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType[ggml_type_name.upper()]
    except KeyError:
        raise ProfileError(f"unknown tensor type {ggml_type_name!r}") from None
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_elements = 1
    for dim in shape:
        n_elements *= int(dim)
    return int(n_elements * type_size // block)


def n_vocab_from(metadata: Mapping[str, Any]) -> int | None:
    arch = metadata.get("general.architecture")
    vocab = metadata.get(f"{arch}.vocab_size")
    if isinstance(vocab, int):
        return vocab
    count = metadata.get("tokenizer.ggml.tokens.count")
    if isinstance(count, int):
        return count
    tokens = metadata.get("tokenizer.ggml.tokens")
    return len(tokens) if isinstance(tokens, list) else None


def n_ff_from(metadata: Mapping[str, Any]) -> int | None:
    arch = metadata.get("general.architecture")
    value = metadata.get(f"{arch}.feed_forward_length")
    if isinstance(value, list) and value:
        return max(int(v) for v in value)
    return value if isinstance(value, int) else None


def as_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"{what} is {value!r}; expected an integer")
    return value
