"""Tokenizers for the simulated models: the real one where the project has its vocabulary, else a stand-in.

Real tokenizers come from ``gateway/data/vocab/ggml-vocab-*.gguf`` through ``gateway.tokens.gguf_vocab``, which
tokenizes like llama.cpp (special tokens parsed, BOS added as the model's metadata says), so the simulator's
``prompt_eval_count`` is the count a real server would report for the same rendered prompt.

The simulator splits a prompt at the vocabulary's special tokens itself, as llama.cpp's
``tokenizer_st_partition`` does, and then tokenizes each piece of text (cached: truncation re-tokenizes the same
turns many times). Like llama.cpp it gives Phi-3's special tokens the right-strip attribute (``llama-vocab.cpp``:
when the lower-cased ``general.name`` holds "phi-3" or "phi3", every special token but ``<unk>``, ``<s>`` and
``<|endoftext|>`` swallows the whitespace after it), so ``<|end|>\n`` is one token, as a real Ollama counts it.
This rule is written here from llama.cpp, not taken from the gateway's tokenizer attributes, so that the two check
each other.

The stand-in (models whose vocabulary is not shipped) is deterministic: template markers are single tokens,
words of up to six letters are one token and longer ones one per six letters, digits go in groups of three,
each run of punctuation or whitespace is one token; ids are a hash of the piece. It is an approximation of a
BPE vocabulary, marked ``is_real = False``.

Generated text is drawn from ``word_ids()``: the 3000 most common plain lower-case word tokens of the vocabulary
(``" the"``, ``" model"``), so a seeded RNG yields readable, real tokens.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import tokenizers

from gateway.support.gguf_reader import read_gguf_metadata
from gateway.tokens.gguf_vocab import tokenizer_from_gguf_metadata
from kvsim.catalog import ModelSpec

VOCAB_DIR = Path(str(importlib.resources.files("gateway"))) / "data" / "vocab"
"""The real tokenizer vocabularies kvgate ships (the simulator speaks with the same tokenizers)."""
COMMON_WORDS = 3000
_WORD_PIECE = re.compile(r"^[\u0120\u2581]([a-z]{3,10})$")
_STAND_IN_SPLIT = re.compile(r" ?[A-Za-z]{1,6}| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+")
_STAND_IN_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there can all their has been if more when will would who so no time about into "
    "than model memory token cache context server request answer system value window layer simple number "
    "light water story river city garden music house question reason result method sample signal energy paper "
    "morning evening north south green quiet bright small large early later often never always because"
)
_STAND_IN_WORDS = tuple(_STAND_IN_TEXT.split())
# template markers the renderers emit; the stand-in tokenizer makes each one token, as the real vocabularies do
_MARKERS = (
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|im_start|>",
    "<|im_end|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "[INST]",
    "[/INST]",
    "</s>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<bos>",
    "<s>",
)
_MARKER_SPLIT = re.compile("(" + "|".join(re.escape(m) for m in _MARKERS) + ")")
_C_SPACE = " \t\n\v\f\r"  # C isspace(): what llama.cpp strips beside a token with the strip attribute
# llama-vocab.cpp: for Phi-3 every special token right-strips, except these
_PHI3_NO_RSTRIP = frozenset({"<unk>", "<s>", "<|endoftext|>"})


def phi3_rstrip(model_name: str) -> bool:
    """Whether llama.cpp gives the special tokens of a model with this ``general.name`` the right-strip attribute."""
    lowered = model_name.lower()
    return "phi-3" in lowered or "phi3" in lowered


class SimTokenizer(Protocol):
    is_real: bool

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the model's server tokenizes a prompt (special tokens parsed, BOS added)."""
        ...

    def word_ids(self) -> Sequence[int]: ...

    def piece(self, token_id: int) -> str:
        """The text one generated token adds to the output."""
        ...


class RealTokenizer:
    is_real = True

    def __init__(
        self, tokenizer: tokenizers.Tokenizer, *, bos_id: int, add_bos: bool, rstrip_special: bool = False
    ) -> None:
        self._tokenizer = tokenizer
        self._bos = [bos_id] if add_bos else []
        self._words: list[int] | None = None
        # every special token of the vocabulary is parsed in a prompt (Ollama tokenizes with parse_special)
        self._markers = {tok.content: i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.content}
        self._rstrip = frozenset(m for m in self._markers if rstrip_special and m not in _PHI3_NO_RSTRIP)
        longest_first = sorted(self._markers, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(m) for m in longest_first) + ")") if self._markers else None
        self._fragment = functools.lru_cache(maxsize=8192)(self._encode_fragment)

    def _encode_fragment(self, text: str) -> tuple[int, ...]:
        return tuple(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        """Split at the special tokens first, as llama.cpp does, so the fragments (whole chat turns) can be cached.

        A fragment after a right-stripping special token loses its leading whitespace (and is dropped when nothing
        else is left); each fragment is tokenized on its own, as llama.cpp tokenizes the pieces between special
        tokens (for SentencePiece vocabularies: with the space prefix a piece after a special token gets)."""
        ids = list(self._bos)
        parts = self._split.split(text) if self._split is not None else [text]
        strip_next = False
        for part in parts:
            marker = self._markers.get(part)
            if marker is not None:
                ids.append(marker)
                strip_next = part in self._rstrip
                continue
            if strip_next:
                part = part.lstrip(_C_SPACE)
                strip_next = False
            if part:
                ids.extend(self._fragment(part))
        return ids

    def word_ids(self) -> Sequence[int]:
        if self._words is None:
            # the earliest merges (lowest ids) are the most common words: walk the ids upwards until there are enough
            # (a few thousand lookups, where copying the whole vocabulary out took ~0.2 s per model)
            words: list[int] = []
            to_token = self._tokenizer.id_to_token
            for token_id in range(self._tokenizer.get_vocab_size()):
                piece = to_token(token_id)
                if piece is not None and _WORD_PIECE.match(piece):
                    words.append(token_id)
                    if len(words) == COMMON_WORDS:
                        break
            self._words = words
        return self._words

    def piece(self, token_id: int) -> str:
        raw = self._tokenizer.id_to_token(token_id) or ""
        return " " + raw[1:] if raw[:1] in ("\u0120", "\u2581") else raw


class StandInTokenizer:
    is_real = False

    def __init__(self, *, vocab_size: int, bos_id: int, add_bos: bool) -> None:
        self._vocab_size = vocab_size
        self._bos = [bos_id] if add_bos else []
        self._pieces: dict[int, str] = {}
        self._words = [self._id(" " + word) for word in _STAND_IN_WORDS]

    def _id(self, piece: str) -> int:
        digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
        token_id = 1000 + int.from_bytes(digest, "little") % (self._vocab_size - 1000)
        self._pieces.setdefault(token_id, piece)
        return token_id

    def encode(self, text: str) -> list[int]:
        ids = list(self._bos)
        for part in _MARKER_SPLIT.split(text):
            if part in _MARKERS:
                ids.append(self._id(part))
            elif part:
                ids.extend(self._id(m.group()) for m in _STAND_IN_SPLIT.finditer(part))
        return ids

    def word_ids(self) -> Sequence[int]:
        return self._words

    def piece(self, token_id: int) -> str:
        return self._pieces.get(token_id, "")


_cache: dict[tuple[str, bool], SimTokenizer] = {}
_lock = threading.Lock()


def tokenizer_for(spec: ModelSpec, *, cache_dir: Path | None = None) -> SimTokenizer:
    """The model's tokenizer, built once per process (converting a vocabulary takes about a second).

    With ``cache_dir`` (``SimConfig.tokenizer_cache_dir``) the converted tokenizer.json is kept there under kvgate's
    key for the GGUF file (``gguf-{key/value digest}``, as ``load_gguf_tokenizer`` stores it), and a later build in
    another process loads it instead of converting again. Where it was built from does not change the tokenizer, so
    the in-process cache ignores it."""
    key = (spec.vocab or f"stand-in:{spec.arch.n_vocab}:{spec.bos_id}", spec.add_bos)
    with _lock:
        found = _cache.get(key)
        if found is None:
            found = _build(spec, cache_dir)
            _cache[key] = found
        return found


def vocab_path(vocab: str) -> Path:
    """The shipped vocabulary file of ``ModelSpec.vocab``."""
    return VOCAB_DIR / f"ggml-vocab-{vocab}.gguf"


def _build(spec: ModelSpec, cache_dir: Path | None) -> SimTokenizer:
    if spec.vocab is not None:
        path = vocab_path(spec.vocab)
        parsed = read_gguf_metadata(path)  # read once: the name and the tokenizer
        meta = parsed.values
        tokenizer = tokenizer_from_gguf_metadata(
            meta, model_name=str(path), cache_dir=cache_dir, cache_key=f"gguf-{parsed.kv_digest}"
        )
        name = str(meta.get("general.name") or "")
        return RealTokenizer(tokenizer, bos_id=spec.bos_id, add_bos=spec.add_bos, rstrip_special=phi3_rstrip(name))
    return StandInTokenizer(vocab_size=spec.arch.n_vocab, bos_id=spec.bos_id, add_bos=spec.add_bos)
