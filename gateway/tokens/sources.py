"""Where a model's tokenizer comes from: a GGUF file, Ollama's `/api/show`, or a tokenizer.json file.

Each source loads once (callers memoize) and reports failure as CounterUnavailable, `permanent` when retrying
cannot help (an unsupported or corrupt tokenizer) so the caller stops asking. Conversions run in a worker thread and
are cached on disk by digest: the GGUF key/value digest, or the model digest Ollama lists in `/api/tags`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import tokenizers

from gateway.backends.client import BackendCallError, BackendClient
from gateway.backends.model_names import same_model
from gateway.support.gguf_reader import GgufFormatError, read_gguf_metadata
from gateway.tokens.count import CounterUnavailable
from gateway.tokens.gguf_vocab import UnsupportedTokenizer, tokenizer_from_gguf_metadata
from gateway.tokens.tokenizer_cache import TokenizerCache


class SourceUnavailable(CounterUnavailable):
    """CounterUnavailable that also says whether retrying later could help."""

    def __init__(self, counter: str, reason: str, *, permanent: bool) -> None:
        super().__init__(counter, reason)
        self.permanent = permanent


@dataclass(frozen=True, slots=True)
class OllamaChatTemplate:
    """What `/api/show` says about how Ollama renders a chat: the Go template, the default system prompt, and the
    built-in renderer that replaces the template when set."""

    template: str
    system: str = ""
    renderer: str = ""


@dataclass(frozen=True, slots=True)
class LoadedTokenizer:
    """A ready tokenizer, whether long texts may be split at line starts, and the model's chat template source
    (Jinja, from a GGUF) or Ollama's Go template."""

    tokenizer: tokenizers.Tokenizer
    chunkable: bool
    chat_template: str | None = None
    ollama_template: OllamaChatTemplate | None = None


class TokenizerSource(Protocol):
    """Loads one model's tokenizer; raises SourceUnavailable."""

    @property
    def kind(self) -> str: ...

    async def load(self) -> LoadedTokenizer: ...


def _from_metadata(meta: dict[str, Any], *, model: str, cache_dir: Path | None, key: str | None) -> LoadedTokenizer:
    tokenizer = tokenizer_from_gguf_metadata(meta, model_name=model, cache_dir=cache_dir, cache_key=key)
    template = meta.get("tokenizer.chat_template")
    return LoadedTokenizer(
        tokenizer=tokenizer,
        chunkable=meta.get("tokenizer.ggml.model") != "llama",
        chat_template=str(template) if template else None,
    )


class GGUFFileSource:
    """The tokenizer inside a GGUF model file (any backend whose model file is readable here)."""

    kind = "gguf"

    def __init__(self, path: Path, *, cache_dir: Path | None = None) -> None:
        self.path = path
        self.cache_dir = cache_dir

    async def load(self) -> LoadedTokenizer:
        return await asyncio.to_thread(self._load)

    def _load(self) -> LoadedTokenizer:
        try:
            parsed = read_gguf_metadata(self.path)
        except OSError as exc:
            raise SourceUnavailable(self.kind, f"cannot read {self.path}: {exc}", permanent=False) from exc
        except GgufFormatError as exc:
            raise SourceUnavailable(self.kind, f"corrupt GGUF {self.path}: {exc}", permanent=True) from exc
        try:
            return _from_metadata(
                parsed.values, model=str(self.path), cache_dir=self.cache_dir, key=f"gguf-{parsed.kv_digest}"
            )
        except UnsupportedTokenizer as exc:
            raise SourceUnavailable(self.kind, str(exc), permanent=True) from exc


class TokenizerJsonSource:
    """A configured Hugging Face tokenizer.json."""

    kind = "tokenizer.json"

    def __init__(self, path: Path, *, chunkable: bool = False, chat_template: str | None = None) -> None:
        self.path = path
        self.chunkable = chunkable
        self.chat_template = chat_template

    async def load(self) -> LoadedTokenizer:
        try:
            tokenizer = await asyncio.to_thread(tokenizers.Tokenizer.from_file, str(self.path))
        except Exception as exc:  # tokenizers raises a plain Exception for unreadable or invalid files
            raise SourceUnavailable(self.kind, f"cannot load {self.path}: {exc}", permanent=True) from exc
        return LoadedTokenizer(tokenizer, chunkable=self.chunkable, chat_template=self.chat_template)


class OllamaShowSource:
    """The GGUF tokenizer of an Ollama model, from `POST /api/show {"verbose": true}` (many MB: cached by digest),
    and its Go chat template (from the same reply, or from a small `verbose: false` one when the tokenizer is cached).
    """

    kind = "gguf"

    def __init__(
        self, client: BackendClient, model: str, *, cache_dir: Path | None = None, timeout_s: float = 120.0
    ) -> None:
        self.client = client
        self.model = model
        self.cache_dir = cache_dir
        self.timeout_s = timeout_s

    async def load(self) -> LoadedTokenizer:
        digest = await self._digest()
        key = f"ollama-{digest}" if digest else None
        if key and self.cache_dir is not None:
            cached = await asyncio.to_thread(TokenizerCache(self.cache_dir).load, key)  # a file read: off the loop
            if cached is not None:
                show = await self._request("POST", "/api/show", {"model": self.model})
                return LoadedTokenizer(cached, chunkable=_chunkable(cached), ollama_template=_ollama_template(show))
        show = await self._request("POST", "/api/show", {"model": self.model, "verbose": True})
        info = show.get("model_info")
        if not isinstance(info, dict):
            raise SourceUnavailable(self.kind, f"/api/show for {self.model!r} has no model_info", permanent=True)
        try:
            loaded = await asyncio.to_thread(
                _from_metadata, info, model=self.model, cache_dir=self.cache_dir, key=key
            )
        except UnsupportedTokenizer as exc:
            raise SourceUnavailable(self.kind, str(exc), permanent=True) from exc
        return dataclasses.replace(loaded, ollama_template=_ollama_template(show))

    async def _digest(self) -> str | None:
        try:
            body = await self._request("GET", "/api/tags", None)
        except SourceUnavailable:
            return None
        for entry in body.get("models") or ():
            names = (entry.get("name"), entry.get("model")) if isinstance(entry, dict) else ()
            if any(isinstance(name, str) and same_model(name, self.model) for name in names):
                digest = entry.get("digest")
                return str(digest) if digest else None
        return None

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        try:
            if method == "GET":
                return await self.client.get_json(path, timeout_s=self.timeout_s)
            return await self.client.post_json(path, payload, timeout_s=self.timeout_s)
        except BackendCallError as exc:
            raise SourceUnavailable(self.kind, f"{self.model!r}: {exc.message}",
                                    permanent=exc.backend_status == 404) from exc


def _ollama_template(show: dict[str, Any]) -> OllamaChatTemplate | None:
    template = show.get("template")
    if not isinstance(template, str) or not template:
        return None
    system, renderer = show.get("system"), show.get("renderer")
    return OllamaChatTemplate(
        template,
        system=system if isinstance(system, str) else "",
        renderer=renderer if isinstance(renderer, str) else "",
    )


def _chunkable(tokenizer: tokenizers.Tokenizer) -> bool:
    # Converted SentencePiece vocabularies prepend U+2581 per fragment (a Prepend normalizer): never split those.
    return "Prepend" not in repr(tokenizer.normalizer)
