"""Tokenizers for the simulated models: the real one where the project has its vocabulary, else a stand-in.

Real tokenizers come from ``gateway/data/vocab/ggml-vocab-*.gguf`` through ``gateway.tokens.gguf_vocab``, which
tokenizes like llama.cpp (special tokens parsed, BOS added as the model's metadata says), so the simulator's
``prompt_eval_count`` is the count a real server would report for the same rendered prompt.

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
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import tokenizers

from gateway.sim.catalog import ModelSpec
from gateway.tokens.gguf_vocab import load_gguf_tokenizer

VOCAB_DIR = Path(__file__).resolve().parent.parent / "data" / "vocab"
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
# template markers the renderers emit; each is one token in the real vocabularies
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

    def __init__(self, tokenizer: tokenizers.Tokenizer, *, bos_id: int, add_bos: bool) -> None:
        self._tokenizer = tokenizer
        self._bos = [bos_id] if add_bos else []
        self._words: list[int] | None = None
        added = {tok.content: i for i, tok in tokenizer.get_added_tokens_decoder().items()}
        self._markers = {m: added[m] for m in _MARKERS if m in added}
        self._split = re.compile("(" + "|".join(re.escape(m) for m in self._markers) + ")") if self._markers else None
        self._fragment = functools.lru_cache(maxsize=8192)(self._encode_fragment)

    def _encode_fragment(self, text: str) -> tuple[int, ...]:
        return tuple(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> list[int]:
        """Split at the template's special tokens first, as llama.cpp and HF tokenizers both do, so the
        fragments (whole chat turns) can be cached: truncation re-tokenizes the same turns many times."""
        ids = list(self._bos)
        parts = self._split.split(text) if self._split is not None else [text]
        for part in parts:
            marker = self._markers.get(part)
            if marker is not None:
                ids.append(marker)
            elif part:
                ids.extend(self._fragment(part))
        return ids

    def word_ids(self) -> Sequence[int]:
        if self._words is None:
            vocab = self._tokenizer.get_vocab()
            # the earliest merges (lowest ids) are the most common words
            self._words = sorted(i for piece, i in vocab.items() if _WORD_PIECE.match(piece))[:COMMON_WORDS]
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


def tokenizer_for(spec: ModelSpec) -> SimTokenizer:
    """The model's tokenizer, built once per process (converting a vocabulary takes about a second)."""
    key = (spec.vocab or f"stand-in:{spec.arch.n_vocab}:{spec.bos_id}", spec.add_bos)
    with _lock:
        found = _cache.get(key)
        if found is None:
            found = _build(spec)
            _cache[key] = found
        return found


def _build(spec: ModelSpec) -> SimTokenizer:
    if spec.vocab is not None:
        tok = load_gguf_tokenizer(VOCAB_DIR / f"ggml-vocab-{spec.vocab}.gguf")
        return RealTokenizer(tok, bos_id=spec.bos_id, add_bos=spec.add_bos)
    return StandInTokenizer(vocab_size=spec.arch.n_vocab, bos_id=spec.bos_id, add_bos=spec.add_bos)
