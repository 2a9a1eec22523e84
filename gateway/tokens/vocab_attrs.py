"""Token attributes the way llama.cpp derives them at load time (src/llama-vocab.cpp `load`).

The GGUF `tokenizer.ggml.token_type` array is only the starting point: llama.cpp then forces some tokens to
CONTROL by their text (end-of-turn, FIM and end-of-generation markers), demotes a few gpt-oss markers to
USER_DEFINED, and gives Phi-3's special tokens RSTRIP. Which tokens are "special" decides how a prompt is split
before BPE: USER_DEFINED tokens are always matched in text, CONTROL and UNKNOWN tokens only with parse_special.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum, IntFlag


class TokenType(IntEnum):
    """Values of `tokenizer.ggml.token_type` (gguf-py `TokenType`)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class Attr(IntFlag):
    """llama.cpp's `llama_token_attr` bits that matter for tokenizing."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


# Attributes are plain ints from here on: a vocabulary has up to ~260K tokens, and IntFlag's `&` and `|` go through
# enum machinery on every call (it was most of the time these functions took). Attr names the bits.
_UNKNOWN, _NORMAL, _CONTROL = int(Attr.UNKNOWN), int(Attr.NORMAL), int(Attr.CONTROL)
_USER_DEFINED, _LSTRIP, _RSTRIP = int(Attr.USER_DEFINED), int(Attr.LSTRIP), int(Attr.RSTRIP)
_SPECIAL = _CONTROL | _USER_DEFINED | _UNKNOWN

# The attribute of each token type, indexed by `tokenizer.ggml.token_type` (UNDEFINED and unknown types: none).
_TYPE_TO_ATTR: tuple[int, ...] = tuple(
    int(
        {
            TokenType.UNKNOWN: Attr.UNKNOWN,
            TokenType.UNUSED: Attr.UNUSED,
            TokenType.NORMAL: Attr.NORMAL,
            TokenType.CONTROL: Attr.CONTROL,
            TokenType.USER_DEFINED: Attr.USER_DEFINED,
            TokenType.BYTE: Attr.BYTE,
        }.get(token_type, Attr.UNDEFINED)
    )
    for token_type in TokenType
)
_LAST_TYPE = len(_TYPE_TO_ATTR) - 1

# Texts llama.cpp promotes to CONTROL wherever they appear (EOT/EOM/FIM detection and the EOG list).
_FORCED_CONTROL = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "<end_of_utterance>",
        "<|eom_id|>",
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<\uff5cfim\u2581begin\uff5c>",
        "<PRE>",
        "\u2581<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<\uff5cfim\u2581hole\uff5c>",
        "<SUF>",
        "\u2581<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<\uff5cfim\u2581end\uff5c>",
        "<MID>",
        "\u2581<MID>",
        "<|code_middle|>",
        "<|middle|>",
        "<|fim_pad|>",
        "<fim-pad>",
        "<fim_pad>",
        "<PAD>",
        "[PAD]",
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
        "<|file_sep|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "</s>",
        "[EOS]",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "[e~[",
    }
)
_GPT_OSS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


@dataclass(frozen=True, slots=True)
class SpecialToken:
    """A token matched in text before BPE: `special` ones only when special tokens are parsed."""

    id: int
    text: str
    special: bool
    lstrip: bool
    rstrip: bool


def token_attrs(
    tokens: Sequence[str], token_types: Sequence[int] | None, index: Mapping[str, int] | None = None
) -> list[int]:
    """Attribute bits (Attr values as plain ints) per token id from the GGUF types, after llama.cpp's text-based
    overrides. `index` maps each text to its (last) id; pass it when the caller has built one already."""
    if token_types is None:
        attrs = [_NORMAL] * len(tokens)
    else:
        table, last = _TYPE_TO_ATTR, _LAST_TYPE
        attrs = [table[t] if 0 <= t <= last else 0 for t in token_types[: len(tokens)]]
        attrs.extend([_NORMAL] * (len(tokens) - len(attrs)))
    if index is None:
        index = _index(tokens)
    for text in _FORCED_CONTROL:
        i = index.get(text)
        if i is not None:
            attrs[i] |= _CONTROL
    for text in _GPT_OSS_USER_DEFINED:
        i = index.get(text)
        if i is not None:
            attrs[i] = _USER_DEFINED
    _harmony_end_fix(index, attrs)
    _plain_end_of_sentence_fix(index, attrs)
    return attrs


def _index(tokens: Sequence[str]) -> dict[str, int]:
    return dict(zip(tokens, range(len(tokens)), strict=True))  # a repeated text keeps its last id


def _harmony_end_fix(index: Mapping[str, int], attrs: list[int]) -> None:
    # o200k_harmony and solar-open: "<|end|>" is a plain marker when "<|return|>"/"<|call|>" exist.
    has_call = "<|call|>" in index or "<|calls|>" in index
    if "<|end|>" in index and has_call and ("<|return|>" in index or "<|flush|>" in index):
        attrs[index["<|end|>"]] = _USER_DEFINED


def _plain_end_of_sentence_fix(index: Mapping[str, int], attrs: list[int]) -> None:
    # gemma4 and plamo have a normal "</s>" token.
    if "</s>" in index and ("<|tool_response>" in index or "<|plamo:eos|>" in index):
        attrs[index["</s>"]] = _NORMAL


def apply_model_name_rules(
    name: str, tokens: Sequence[str], attrs: list[int], index: Mapping[str, int] | None = None
) -> None:
    """Per-model attribute rules keyed by the lower-cased `general.name` (only Phi-3's matter for chat)."""
    lowered = name.lower()
    if "phi-3" not in lowered and "phi3" not in lowered:
        return
    if index is None:
        index = _index(tokens)
    for i, attr in enumerate(attrs):
        if attr & _SPECIAL:
            attrs[i] = attr | _RSTRIP
    for text, rstrip in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
        found = index.get(text)
        if found is not None:
            attrs[found] = attrs[found] | _RSTRIP if rstrip else attrs[found] & ~_RSTRIP


def special_tokens(tokens: Sequence[str], attrs: Sequence[int]) -> list[SpecialToken]:
    """Tokens llama.cpp partitions out of the text before BPE (its `cache_special_tokens`)."""
    if len(tokens) != len(attrs):
        raise ValueError(f"{len(tokens)} tokens but {len(attrs)} attributes")
    special, user_defined, parsed_only = _SPECIAL, _USER_DEFINED, _CONTROL | _UNKNOWN
    return [
        SpecialToken(
            id=i,
            text=tokens[i],
            special=not (attrs[i] & user_defined) or bool(attrs[i] & parsed_only),
            lstrip=bool(attrs[i] & _LSTRIP),
            rstrip=bool(attrs[i] & _RSTRIP),
        )
        for i in [i for i, attr in enumerate(attrs) if attr & special]
    ]
