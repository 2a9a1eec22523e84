"""OpenAI's tiktoken encodings, loaded only from a configured directory: no network at run time.

tiktoken itself downloads an encoding on first use into a cache named by the SHA-1 of its URL. Here the same file
is looked up in `cache_dir`, under that name or as `<encoding>.tiktoken`, its SHA-256 is checked, and the
Encoding is built directly; when the file is absent the counter is unavailable with a reason saying where it looked.
For local models these counts are approximations (another vocabulary), so they are never `exact`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tiktoken

from gateway.tokens.count import CounterUnavailable, Message, TokenCount, Tool
from gateway.tokens.countable_text import ByteText, content_text, count_content_images, decode_text, json_text

_BLOB = "https://openaipublic.blob.core.windows.net/encodings/"
_ENDOFTEXT, _FIM_PREFIX, _FIM_MIDDLE, _FIM_SUFFIX, _ENDOFPROMPT = (
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|endofprompt|>",
)
_R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]"""
    r"""|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


@dataclass(frozen=True, slots=True)
class EncodingSpec:
    """What tiktoken_ext.openai_public would build, minus the download."""

    file: str
    sha256: str
    pat_str: str
    special_tokens: dict[str, int]

    @property
    def url(self) -> str:
        return _BLOB + self.file


ENCODINGS: dict[str, EncodingSpec] = {
    "cl100k_base": EncodingSpec(
        "cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        _CL100K_PAT,
        {_ENDOFTEXT: 100257, _FIM_PREFIX: 100258, _FIM_MIDDLE: 100259, _FIM_SUFFIX: 100260, _ENDOFPROMPT: 100276},
    ),
    "o200k_base": EncodingSpec(
        "o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PAT,
        {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    ),
    "r50k_base": EncodingSpec(
        "r50k_base.tiktoken",
        "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        _R50K_PAT,
        {_ENDOFTEXT: 50256},
    ),
    "p50k_base": EncodingSpec(
        "p50k_base.tiktoken",
        "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
        _R50K_PAT,
        {_ENDOFTEXT: 50256},
    ),
}


def candidate_paths(spec: EncodingSpec, cache_dir: Path) -> list[Path]:
    """Where an encoding file may be: tiktoken's own cache name (SHA-1 of the URL), or its file name."""
    return [cache_dir / hashlib.sha1(spec.url.encode()).hexdigest(), cache_dir / spec.file]  # noqa: S324


def load_encoding(name: str, cache_dir: Path, *, specs: Mapping[str, EncodingSpec] = ENCODINGS) -> tiktoken.Encoding:
    """Build a tiktoken Encoding from a file in `cache_dir`; CounterUnavailable says what was missing."""
    counter = f"tiktoken:{name}"
    spec = specs.get(name)
    if spec is None:
        raise CounterUnavailable(counter, f"unknown encoding (known: {', '.join(specs)})")
    for path in candidate_paths(spec, cache_dir):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != spec.sha256:
            raise CounterUnavailable(counter, f"{path} does not match the published SHA-256 of {spec.file}")
        ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}
        return tiktoken.Encoding(name, pat_str=spec.pat_str, mergeable_ranks=ranks, special_tokens=spec.special_tokens)
    looked = ", ".join(str(p) for p in candidate_paths(spec, cache_dir))
    raise CounterUnavailable(counter, f"encoding file not found offline (looked for {looked})")


class TiktokenCounter:
    """Approximate counts with an OpenAI encoding; chat overhead as OpenAI documents it (3 per message + 3)."""

    def __init__(
        self,
        encoding: str,
        cache_dir: Path,
        *,
        image_tokens: int = 768,
        specs: Mapping[str, EncodingSpec] = ENCODINGS,
    ) -> None:
        self.encoding_name = encoding
        self.cache_dir = cache_dir
        self.specs = specs
        self.image_tokens = image_tokens
        self._encoding: tiktoken.Encoding | None = None
        self._failure: CounterUnavailable | None = None

    @property
    def name(self) -> str:
        return f"tiktoken:{self.encoding_name}"

    async def _load(self) -> tiktoken.Encoding:
        if self._encoding is None:
            if self._failure is not None:
                raise self._failure
            try:
                self._encoding = await asyncio.to_thread(
                    load_encoding, self.encoding_name, self.cache_dir, specs=self.specs
                )
            except CounterUnavailable as exc:
                self._failure = exc
                raise
        return self._encoding

    def _count(self, encoding: tiktoken.Encoding, texts: Sequence[str]) -> int:
        return sum(len(ids) for ids in encoding.encode_ordinary_batch(list(texts)))

    async def count_text(self, text: str | bytes, *, add_special: bool = True) -> TokenCount:
        encoding = await self._load()
        decoded = decode_text(text)
        if isinstance(decoded, ByteText):
            return TokenCount(decoded.n_bytes, f"{self.name}/bytes", exact=False)
        return TokenCount(self._count(encoding, [decoded]), self.name, exact=False)

    async def count_chat(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> TokenCount:
        encoding = await self._load()
        texts = [content_text(m.get("content")) for m in messages]
        texts += [json_text(call) for m in messages for call in (m.get("tool_calls") or ())]
        texts += [json_text(tool) for tool in tools]
        strings = [d for d in map(decode_text, texts) if isinstance(d, str)]
        extra = sum(d.n_bytes for d in map(decode_text, texts) if isinstance(d, ByteText))
        images = sum(count_content_images(m.get("content")) + len(m.get("images") or ()) for m in messages)
        tokens = self._count(encoding, strings) + extra + 3 * len(messages) + 3 + images * self.image_tokens
        return TokenCount(tokens, self.name, exact=False)
