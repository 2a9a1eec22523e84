"""Turn a GGUF tokenizer (file or Ollama `/api/show` model_info) into a Hugging Face `tokenizers.Tokenizer`.

The result tokenizes like llama.cpp (src/llama-vocab.cpp), checked against llama.cpp's own test vectors:

    GGUF                        Hugging Face tokenizer.json
    gpt2 + pre                  BPE over byte-level pieces; pre-tokenizer = llama.cpp's split regexes for `pre`
                                (each an isolated Split), then ByteLevel without its own regex; `ignore_merges`
                                where llama.cpp sets it (llama-bpe and friends)
    llama (SentencePiece)       BPE with merges derived from the vocabulary (spm_merges), byte fallback,
                                spaces as U+2581 and one prepended to every text fragment
    gemma4                      BPE over raw UTF-8 with U+2581 for spaces, split on newline runs, byte fallback
    token types                 CONTROL/UNKNOWN -> special added tokens (matched only when special tokens are
                                parsed); USER_DEFINED -> added tokens matched always, as llama.cpp does

`encode(text, add_special_tokens=True)` adds BOS/EOS as llama.cpp's add_special does. Parsing of special tokens
is on (llama-server's chat path); set `tokenizer.encode_special_tokens = True` for parse_special=false.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import tokenizers

from gateway.support.gguf_reader import GgufFormatError, GgufMetadata, read_gguf_metadata
from gateway.tokens.pretokenizers import PreTokenizerSpec, pre_tokenizer_spec
from gateway.tokens.spm_merges import spm_merges
from gateway.tokens.tokenizer_cache import FileIdentity, TokenizerCache
from gateway.tokens.vocab_attrs import apply_model_name_rules, special_tokens, token_attrs

__all__ = [
    "UnsupportedTokenizer",
    "load_gguf_tokenizer",
    "metadata_digest",
    "read_gguf_tokenizer_metadata",
    "tokenizer_from_gguf_metadata",
    "tokenizer_json_from_gguf_metadata",
]

_SPACE = "\u2581"
_SUPPORTED_MODELS = ("gpt2", "llama", "gemma4")
# What read_gguf_tokenizer_metadata keeps: everything a tokenizer conversion or a cache key needs.
_TOKENIZER_KEY_PREFIXES = ("tokenizer.", "general.architecture", "general.name", "general.basename")


class UnsupportedTokenizer(Exception):
    """Raised when a GGUF tokenizer cannot be converted; the message names the model and the reason."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"tokenizer of model {model!r} is not supported: {reason}")
        self.model = model
        self.reason = reason


def read_gguf_tokenizer_metadata(path: Path) -> dict[str, Any]:
    """The tokenizer.* and general.* key/values of a GGUF file (tensors are never read)."""
    values = read_gguf_metadata(path).values
    return {key: value for key, value in values.items() if key.startswith(_TOKENIZER_KEY_PREFIXES)}


def load_gguf_tokenizer(
    path: Path,
    *,
    cache_dir: Path | None = None,
    read_metadata: Callable[[Path], GgufMetadata] = read_gguf_metadata,
) -> tokenizers.Tokenizer:
    """Read a GGUF file's tokenizer and convert it, once per vocabulary when `cache_dir` is given.

    The cache key is the digest of the file's key/value section, so copies and renames of a model share one
    entry. Computing it reads every string of the vocabulary, so the cache also remembers each file's key while the
    file is unchanged (`TokenizerCache.file_key`): loading a cached tokenizer again does not read the GGUF file.
    UnsupportedTokenizer names the file and the reason. `read_metadata` parses the file (a test counts the reads).
    """
    cache = TokenizerCache(cache_dir) if cache_dir is not None else None
    identity: FileIdentity | None = None
    if cache is not None:
        known = cache.file_key(path)
        cached = cache.load(known) if known is not None else None
        if cached is not None:
            return cached
        try:
            identity = FileIdentity.of(path)  # before reading: a change made while it is read is never recorded
        except OSError:
            identity = None  # read_gguf_metadata reports it
    try:
        parsed = read_metadata(path)
    except (OSError, GgufFormatError) as exc:
        raise UnsupportedTokenizer(str(path), f"cannot read GGUF metadata: {exc}") from exc
    key = f"gguf-{parsed.kv_digest}"
    tokenizer = tokenizer_from_gguf_metadata(parsed.values, model_name=str(path), cache_dir=cache_dir, cache_key=key)
    if cache is not None and identity is not None:
        cache.remember_file_key(identity, key)
    return tokenizer


def tokenizer_from_gguf_metadata(
    meta: Mapping[str, Any],
    *,
    model_name: str | None = None,
    cache_dir: Path | None = None,
    cache_key: str | None = None,
) -> tokenizers.Tokenizer:
    """Build the tokenizer from GGUF key/values (the same keys as Ollama's verbose `/api/show` model_info).

    With `cache_dir`, the converted tokenizer.json is stored under `cache_key` (default: a digest of the
    tokenizer keys) and later calls load it instead of converting again.
    """
    name = model_name or _model_label(meta)
    try:
        if cache_dir is None:
            return _convert(meta, name)[0]
        cache = TokenizerCache(cache_dir)
        key = cache_key or metadata_digest(meta)
        cached = cache.load(key)
        if cached is not None:
            return cached
        tokenizer, document = _convert(meta, name)
        cache.store_or_warn(key, orjson.dumps(document))  # what tokenizer_json_from_gguf_metadata returns
        return tokenizer
    except UnsupportedTokenizer:
        raise
    except Exception as exc:  # tokenizers raises plain Exception subclasses from Rust
        raise UnsupportedTokenizer(name, f"tokenizers rejected the converted vocabulary: {exc}") from exc


def metadata_digest(meta: Mapping[str, Any]) -> str:
    """A digest of the tokenizer.* keys (and the model name, which decides Phi-3's rules)."""
    keys = sorted(k for k in meta if k.startswith("tokenizer.ggml.") or k == "general.name")
    payload = orjson.dumps({k: meta[k] for k in keys}, option=orjson.OPT_SERIALIZE_NUMPY)
    return "meta-" + hashlib.sha256(payload).hexdigest()


def tokenizer_json_from_gguf_metadata(meta: Mapping[str, Any], *, model_name: str | None = None) -> str:
    """The tokenizer.json text for GGUF key/values (what the disk cache stores)."""
    return orjson.dumps(_tokenizer_document(meta, model_name or _model_label(meta), check_merges=True)).decode()


def _convert(meta: Mapping[str, Any], name: str) -> tuple[tokenizers.Tokenizer, dict[str, Any]]:
    """The tokenizer and the document it is built from (tokenizer_json_from_gguf_metadata's, parsed).

    The document's merges are first left unchecked: the BPE model rejects a merge whose pieces are not all in the
    vocabulary, which no merge of a sound vocabulary does, and checking ~500K merges in Python costs more than a
    tenth of a second. Only when the model rejects them are they filtered as tokenizer_json_from_gguf_metadata
    filters them, so both give the same tokenizer.
    """
    document = _tokenizer_document(meta, name, check_merges=False)
    try:
        return _tokenizer_from_document(document), document
    except Exception:  # tokenizers raises plain Exception subclasses from Rust
        model = document["model"]
        merges = _merges_in_vocabulary(model["merges"], model["vocab"])
        if len(merges) == len(model["merges"]):
            raise
        model["merges"] = merges
        return _tokenizer_from_document(document), document


def _tokenizer_from_document(document: dict[str, Any]) -> tokenizers.Tokenizer:
    """`Tokenizer.from_str(orjson.dumps(document))`, with the BPE model built from the Python vocabulary and merges.

    tokenizers parses a model's JSON through two generic intermediate values; handing it the dict and the list
    directly builds the same model in about half the time (Gemma-4: 262K tokens, 515K merges). The rest of the
    document is parsed as JSON without them, then the added tokens are added as the JSON parser adds them: after
    the model, so that each keeps the id the vocabulary gives it.
    """
    model = document["model"]
    if model["type"] != "BPE":
        return tokenizers.Tokenizer.from_str(orjson.dumps(document).decode())
    skeleton = {**document, "added_tokens": [], "model": {**model, "vocab": {}, "merges": []}}
    tokenizer = tokenizers.Tokenizer.from_str(orjson.dumps(skeleton).decode())
    options = {key: model[key] for key in _BPE_OPTIONS if model[key] is not None}  # None: the option is unset
    tokenizer.model = tokenizers.models.BPE(vocab=model["vocab"], merges=model["merges"], **options)
    tokenizer.add_tokens(
        [
            tokenizers.AddedToken(
                token["content"],
                single_word=token["single_word"],
                lstrip=token["lstrip"],
                rstrip=token["rstrip"],
                normalized=token["normalized"],
                special=token["special"],
            )
            for token in document["added_tokens"]
        ]
    )
    return tokenizer


# The BPE model's keys in tokenizer.json besides type, vocab and merges: keyword arguments of models.BPE.
_BPE_OPTIONS = (
    "dropout",
    "unk_token",
    "continuing_subword_prefix",
    "end_of_word_suffix",
    "fuse_unk",
    "byte_fallback",
    "ignore_merges",
)


def _tokenizer_document(meta: Mapping[str, Any], name: str, *, check_merges: bool) -> dict[str, Any]:
    """The tokenizer.json document; without `check_merges`, merges whose pieces are not in the vocabulary stay."""
    model = str(meta.get("tokenizer.ggml.model") or "")
    if model not in _SUPPORTED_MODELS:
        raise UnsupportedTokenizer(name, f"tokenizer.ggml.model {model!r} (supported: {', '.join(_SUPPORTED_MODELS)})")
    tokens = _tokens(meta, name)
    vocab = _vocab(tokens)
    attrs = token_attrs(tokens, _int_list(meta.get("tokenizer.ggml.token_type"), name, "token_type"), vocab)
    general_name = str(meta.get("general.name") or meta.get("general.architecture") or "")
    apply_model_name_rules(general_name, tokens, attrs, vocab)
    if model == "llama":
        doc = _spm_document(meta, tokens, vocab, attrs, name)
    else:
        doc = _bpe_document(meta, model, vocab, name, check_merges=check_merges)
    doc["added_tokens"] = _added_tokens(tokens, attrs)
    doc["post_processor"] = _post_processor(meta, model, tokens)
    return doc


def _model_label(meta: Mapping[str, Any]) -> str:
    for key in ("general.name", "general.basename", "general.architecture"):
        value = meta.get(key)
        if value:
            return str(value)
    return "unknown model"


def _tokens(meta: Mapping[str, Any], name: str) -> list[str]:
    raw = meta.get("tokenizer.ggml.tokens")
    if not isinstance(raw, list) or not raw:
        raise UnsupportedTokenizer(name, "tokenizer.ggml.tokens is missing or empty (Ollama: use verbose /api/show)")
    # llama.cpp renames empty pieces so every id keeps a distinct text.
    return [str(t) if t else f"[EMPTY_{i}]" for i, t in enumerate(raw)]


def _int_list(raw: Any, name: str, field: str) -> list[int] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise UnsupportedTokenizer(name, f"tokenizer.ggml.{field} is not a list (Ollama: use verbose /api/show)")
    return list(map(int, raw))


def _vocab(tokens: Sequence[str]) -> dict[str, int]:
    return dict(zip(tokens, range(len(tokens)), strict=True))  # a repeated text maps to its last id, as in llama.cpp


def _bpe_merges(
    meta: Mapping[str, Any], vocab: Mapping[str, int], name: str, *, check: bool = True
) -> list[tuple[str, str]]:
    raw = meta.get("tokenizer.ggml.merges")
    if not isinstance(raw, list) or not raw:
        raise UnsupportedTokenizer(name, "tokenizer.ggml.merges is missing or empty")
    # Gemma-4 has ~500K merges, so this runs as comprehensions and C-level set checks, not a loop per merge.
    texts: list[str] = raw if all(type(entry) is str for entry in raw) else [str(entry) for entry in raw]
    # llama.cpp splits at the first space after the first character.
    pairs = [(text[:cut], text[cut + 1 :]) for text in texts if (cut := text.find(" ", 1)) > 0]
    # llama.cpp keeps the first rank of a repeated pair (dict.fromkeys keeps first occurrences, in order); distinct
    # texts are distinct pairs, the usual case.
    if len(set(texts)) != len(texts):
        pairs = list(dict.fromkeys(pairs))
    return _merges_in_vocabulary(pairs, vocab) if check else pairs


def _merges_in_vocabulary(pairs: list[tuple[str, str]], vocab: Mapping[str, int]) -> list[tuple[str, str]]:
    """The merges tokenizers accepts: both pieces and their concatenation are in the vocabulary."""
    lefts, rights = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
    known = vocab.keys()
    if known >= set(lefts) and known >= set(rights) and all(map(vocab.__contains__, map(operator.add, lefts, rights))):
        return pairs  # the usual case, checked in C
    return [pair for pair in pairs if pair[0] in vocab and pair[1] in vocab and pair[0] + pair[1] in vocab]


def _bpe_document(
    meta: Mapping[str, Any], model: str, vocab: dict[str, int], name: str, *, check_merges: bool
) -> dict[str, Any]:
    pre = str(meta.get("tokenizer.ggml.pre") or "") if model == "gpt2" else "gemma4"
    spec = pre_tokenizer_spec(pre)
    if spec is None:
        raise UnsupportedTokenizer(name, f"tokenizer.ggml.pre {pre!r} has no regex equivalent here")
    splits: list[dict[str, Any]] = [
        {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in spec.regexes
    ]
    doc = _document(
        model={
            **_bpe_model(vocab, _bpe_merges(meta, vocab, name, check=check_merges)),
            "byte_fallback": not spec.byte_encode,
            "ignore_merges": spec.ignore_merges,
        },
    )
    if spec.byte_encode:
        splits.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False})
        doc["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    else:
        doc["decoder"] = _metaspace_decoder(strip_first=False)
    if spec.escape_whitespace:
        doc["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": _SPACE}
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": splits}
    return doc


def _spm_document(
    meta: Mapping[str, Any], tokens: list[str], vocab: dict[str, int], attrs: list[int], name: str
) -> dict[str, Any]:
    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) < len(tokens):
        raise UnsupportedTokenizer(name, "SentencePiece vocabulary without tokenizer.ggml.scores")
    unk_id = int(meta.get("tokenizer.ggml.unknown_token_id", 0))
    model = {
        **_bpe_model(vocab, spm_merges(tokens, scores, attrs)),
        "unk_token": tokens[unk_id] if 0 <= unk_id < len(tokens) else None,
        "fuse_unk": True,
        "byte_fallback": True,
        "ignore_merges": False,
    }
    doc = _document(model=model)
    steps: list[dict[str, Any]] = []
    if bool(meta.get("tokenizer.ggml.add_space_prefix", True)):
        steps.append({"type": "Prepend", "prepend": _SPACE})
    steps.append({"type": "Replace", "pattern": {"String": " "}, "content": _SPACE})
    doc["normalizer"] = {"type": "Sequence", "normalizers": steps}
    doc["decoder"] = _metaspace_decoder(strip_first=True)
    return doc


def _bpe_model(vocab: dict[str, int], merges: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "vocab": vocab,
        "merges": merges,
    }


def _document(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": None,
        "model": model,
    }


def _metaspace_decoder(*, strip_first: bool) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": _SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if strip_first:
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {"type": "Sequence", "decoders": steps}


def _added_tokens(tokens: Sequence[str], attrs: Sequence[int]) -> list[dict[str, Any]]:
    return [
        {
            "id": tok.id,
            "content": tok.text,
            "single_word": False,
            "lstrip": tok.lstrip,
            "rstrip": tok.rstrip,
            "normalized": False,
            "special": tok.special,
        }
        for tok in special_tokens(tokens, attrs)
    ]


def _post_processor(meta: Mapping[str, Any], model: str, tokens: Sequence[str]) -> dict[str, Any] | None:
    add_bos, add_eos = _add_bos_eos(meta, model)
    bos = _special_id(meta, "bos", tokens) if add_bos else None
    eos = _special_id(meta, "eos", tokens) if add_eos else None
    if bos is None and eos is None:
        return None
    single: list[dict[str, Any]] = []
    specials: dict[str, Any] = {}
    for token_id in (bos,):
        if token_id is not None:
            single.append({"SpecialToken": {"id": tokens[token_id], "type_id": 0}})
            specials[tokens[token_id]] = {"id": tokens[token_id], "ids": [token_id], "tokens": [tokens[token_id]]}
    single.append({"Sequence": {"id": "A", "type_id": 0}})
    if eos is not None:
        single.append({"SpecialToken": {"id": tokens[eos], "type_id": 0}})
        specials[tokens[eos]] = {"id": tokens[eos], "ids": [eos], "tokens": [tokens[eos]]}
    pair = [*single, *[{**p, "Sequence": {"id": "B", "type_id": 1}} if "Sequence" in p else p for p in single]]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def _add_bos_eos(meta: Mapping[str, Any], model: str) -> tuple[bool, bool]:
    if model == "llama":
        add_bos, add_eos = True, False
    elif model == "gemma4":
        add_bos, add_eos = True, False  # llama.cpp forces BOS for Gemma 4 whatever the file says
    else:
        spec: PreTokenizerSpec | None = pre_tokenizer_spec(str(meta.get("tokenizer.ggml.pre") or ""))
        add_bos = bool(spec and spec.add_bos)
        add_eos = False
    if "tokenizer.ggml.add_bos_token" in meta and model != "gemma4":
        add_bos = bool(meta["tokenizer.ggml.add_bos_token"])
    if "tokenizer.ggml.add_eos_token" in meta:
        add_eos = bool(meta["tokenizer.ggml.add_eos_token"])
    return add_bos, add_eos


def _special_id(meta: Mapping[str, Any], which: str, tokens: Sequence[str]) -> int | None:
    raw = meta.get(f"tokenizer.ggml.{which}_token_id")
    if raw is None:
        defaults = {"llama": {"bos": 1, "eos": 2}, "gpt2": {"bos": 11, "eos": 11}}
        raw = defaults.get(str(meta.get("tokenizer.ggml.model")), {}).get(which)
    if raw is None or not 0 <= int(raw) < len(tokens):
        return None
    return int(raw)
