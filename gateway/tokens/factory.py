"""Assemble the counter chain for one model on one backend, from the counters its runtime names (gateway/runtimes/).

Settings are plain data, built once from the gateway config; nothing here reads the environment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gateway.tokens.byte_estimate import EstimateCounter
from gateway.tokens.chain import CounterChain
from gateway.tokens.count import Counter
from gateway.tokens.message_cache import CountCache
from gateway.tokens.sources import GGUFFileSource, TokenizerJsonSource
from gateway.tokens.tiktoken_counter import TiktokenCounter
from gateway.tokens.tokenizer_counter import AUTO_TEMPLATE, TokenizerCounter


@dataclass(frozen=True, slots=True)
class CountingSettings:
    """How kvgate counts tokens; per-model maps are keyed by the model name clients send."""

    cache_dir: Path | None = None  # converted tokenizers (tokenizer.json per digest)
    gguf_paths: dict[str, Path] = field(default_factory=dict)  # model -> GGUF file readable by the gateway
    tokenizer_json: dict[str, Path] = field(default_factory=dict)  # model -> configured tokenizer.json
    chat_templates: dict[str, str] = field(default_factory=dict)  # model -> template family (templates.py)
    tiktoken_encoding: str | None = None  # e.g. "o200k_base"; needs tiktoken_dir
    tiktoken_dir: Path | None = None
    image_tokens: dict[str, int] = field(default_factory=dict)  # model -> tokens per image (default 768)
    default_image_tokens: int = 768
    estimate_bytes_per_token: float = 3.0
    estimate_safety_margin: float = 0.10
    message_cache_entries: int = 8192
    message_cache_chars: int = 16 * 1024 * 1024  # texts a chain's count cache holds, in all (one model's)


ReadTokenizer = Callable[[CountCache, int], Counter]
"""Builds the counter that reads the model's tokenizer from the backend itself (Ollama's /api/show), given the chain's
count cache and the tokens per image."""


def build_counter_chain(
    model: str,
    *,
    settings: CountingSettings,
    served: Sequence[Counter] = (),
    read_tokenizer: ReadTokenizer | None = None,
    llama_server_template: str | None = None,
) -> CounterChain:
    """The chain for `model`: first the counters the backend serves (its own tokenizer: llama-server's /tokenize, an
    OpenAI-compatible server's tokenize endpoint), then the configured GGUF file, else the tokenizer read from the
    backend (`read_tokenizer`), then a configured tokenizer.json, tiktoken, and the byte estimate last. Which of the
    backend's counters there are is its runtime's (gateway/runtimes/).

    `llama_server_template` is the family detected from the server's GET /props chat_template (templates.
    detect_template); it lets the GGUF fallback render chats exactly like the server.
    """
    image_tokens = settings.image_tokens.get(model, settings.default_image_tokens)
    cache = CountCache(max_entries=settings.message_cache_entries, max_chars=settings.message_cache_chars)
    counters: list[Counter] = list(served)
    template = settings.chat_templates.get(model, llama_server_template or AUTO_TEMPLATE)
    if model in settings.gguf_paths:
        source = GGUFFileSource(settings.gguf_paths[model], cache_dir=settings.cache_dir)
        counters.append(
            TokenizerCounter(source, model=model, template=template, image_tokens=image_tokens, cache=cache)
        )
    elif read_tokenizer is not None:
        counters.append(read_tokenizer(cache, image_tokens))
    if model in settings.tokenizer_json:
        json_source = TokenizerJsonSource(settings.tokenizer_json[model])
        counters.append(
            TokenizerCounter(json_source, model=model, template=settings.chat_templates.get(model), cache=cache)
        )
    if settings.tiktoken_encoding and settings.tiktoken_dir is not None:
        counters.append(TiktokenCounter(settings.tiktoken_encoding, settings.tiktoken_dir, image_tokens=image_tokens))
    counters.append(
        EstimateCounter(
            bytes_per_token=settings.estimate_bytes_per_token,
            safety_margin=settings.estimate_safety_margin,
            image_tokens=image_tokens,
        )
    )
    return CounterChain(model, counters)
