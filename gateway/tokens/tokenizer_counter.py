"""A Counter backed by the model's own tokenizer (GGUF or tokenizer.json).

Chats are counted one of three ways:

    template   the chat template family is known (templates.py): render it as llama-server does, count each
               message's segment (cached), add BOS. Exact.
    go         Ollama's Go template from /api/show (gotemplate.py): render it as Ollama's template.Execute does,
               count each message's segment (cached), add BOS. Exact from the first request, unless the chat has
               images or tools (then a close estimate).
    content    otherwise (a template the interpreter cannot run, or a chat it cannot render): count each message's
               text, tool calls and tool schemas as JSON, images at a fixed cost, plus a per-message/per-request
               overhead learned from the backend's reported prompt lengths (OverheadEstimator). Exact only once the
               learned overhead reproduces every sample.

The tokenizer loads on first use; a failure is remembered (for `retry_after_s`, or for good when it cannot change)
and reported as CounterUnavailable, so a chain falls through to its next counter without retrying every request.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Sequence

from gateway.tokens.count import CounterUnavailable, Message, TokenCount, Tool
from gateway.tokens.countable_text import ByteText, content_text, count_content_images, decode_text, json_text
from gateway.tokens.engine import TokenizerEngine
from gateway.tokens.gotemplate import OllamaTemplate
from gateway.tokens.gotemplate import TemplateError as GoTemplateError
from gateway.tokens.message_cache import CountCache
from gateway.tokens.overhead import OverheadEstimator
from gateway.tokens.sources import OllamaChatTemplate, SourceUnavailable, TokenizerSource
from gateway.tokens.templates import TemplateError, detect_template, render

AUTO_TEMPLATE = "auto"  # use the family of the chat template found in the GGUF, if any


class TokenizerCounter:
    """Counts one model's prompts with its tokenizer; see the module docstring for the two chat modes."""

    def __init__(
        self,
        source: TokenizerSource,
        *,
        model: str,
        template: str | None = None,
        overhead: OverheadEstimator | None = None,
        image_tokens: int = 768,
        cache: CountCache | None = None,
        today: Callable[[], dt.date] = dt.date.today,
        retry_after_s: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.model = model
        self.template = template
        self.overhead = overhead if overhead is not None else OverheadEstimator()
        self.image_tokens = image_tokens
        self._cache = cache
        self._today = today
        self._retry_after_s = retry_after_s
        self._monotonic = monotonic
        self._engine: TokenizerEngine | None = None
        self._family: str | None = None
        self._go_template: OllamaTemplate | None = None
        self._failure: tuple[SourceUnavailable, float] | None = None
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return self.source.kind

    async def engine(self) -> TokenizerEngine:
        """The loaded tokenizer; raises CounterUnavailable while loading fails."""
        if self._engine is not None:
            return self._engine
        async with self._lock:
            if self._engine is not None:
                return self._engine
            if self._failure is not None:
                failure, at = self._failure
                if failure.permanent or self._monotonic() - at < self._retry_after_s:
                    raise CounterUnavailable(self.name, f"model {self.model!r}: {failure.reason}")
            try:
                loaded = await self.source.load()
            except SourceUnavailable as exc:
                self._failure = (exc, self._monotonic())
                raise CounterUnavailable(self.name, f"model {self.model!r}: {exc.reason}") from exc
            self._family = detect_template(loaded.chat_template) if self.template == AUTO_TEMPLATE else self.template
            if self._family is None and loaded.ollama_template is not None:
                self._go_template = _go_template(loaded.ollama_template)
            self._engine = TokenizerEngine(loaded.tokenizer, chunkable=loaded.chunkable, cache=self._cache)
            return self._engine

    async def count_text(self, text: str | bytes, *, add_special: bool = True) -> TokenCount:
        engine = await self.engine()
        decoded = decode_text(text)
        if isinstance(decoded, ByteText):
            return TokenCount(decoded.n_bytes, f"{self.name}/bytes", exact=False)
        (count,) = await engine.count([decoded])
        return TokenCount(count + (engine.special_tokens_added if add_special else 0), self.name, exact=True)

    async def count_chat(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> TokenCount:
        engine = await self.engine()
        if self._family is not None:
            try:
                segments = render(self._family, messages, tools, today=self._today())
            except TemplateError:
                pass  # this chat needs what the family cannot render exactly: count contents instead
            else:
                counts = await engine.count(_safe_segments(segments, engine))
                return TokenCount(sum(counts) + engine.special_tokens_added, self.name, exact=True)
        if self._go_template is not None:
            try:
                rendered = self._go_template.render(messages, tools, today=self._today())
            except GoTemplateError:
                pass  # this chat needs what the interpreter does not reproduce: count contents instead
            else:
                decoded = [decode_text(s) for s in rendered.segments]
                if all(isinstance(d, str) for d in decoded):
                    counts = await engine.count(_safe_segments(rendered.segments, engine))
                    tokens = sum(counts) + engine.special_tokens_added + rendered.images * self.image_tokens
                    return TokenCount(tokens, self.name, exact=rendered.exact)
        content_tokens = await self.content_tokens(messages, tools)
        overhead = self.overhead.current()
        tokens = content_tokens + overhead.tokens(len(messages)) + engine.special_tokens_added
        return TokenCount(tokens, self.name, exact=overhead.exact, content_tokens=content_tokens)

    async def content_tokens(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """Tokens of the message texts, tool calls and tool schemas, plus images at their fixed cost."""
        engine = await self.engine()
        texts: list[str] = []
        images = 0
        for message in messages:
            content = message.get("content")
            texts.append(content_text(content))
            images += count_content_images(content) + len(message.get("images") or ())
            for key in ("thinking", "reasoning_content"):
                if isinstance(message.get(key), str):
                    texts.append(str(message[key]))
            for call in message.get("tool_calls") or ():
                texts.append(json_text(call.get("function", call) if isinstance(call, dict) else call))
        texts.extend(json_text(tool) for tool in tools)
        decoded = [decode_text(t) for t in texts]
        byte_lengths = sum(d.n_bytes for d in decoded if isinstance(d, ByteText))
        counts = await engine.count([d for d in decoded if isinstance(d, str)])
        return sum(counts) + byte_lengths + images * self.image_tokens

    async def calibrate(self, messages: Sequence[Message], tools: Sequence[Tool], observed_prompt_tokens: int,
                        content_tokens: int | None = None) -> None:
        """Feed a backend-reported prompt length (Ollama `prompt_eval_count`) to the overhead estimator; the
        contents' tokens are counted unless ``content_tokens`` (this counter's, from the request's count) has them."""
        engine = await self.engine()
        content = await self.content_tokens(messages, tools) if content_tokens is None else content_tokens
        self.overhead.observe(len(messages), content + engine.special_tokens_added, observed_prompt_tokens)


def _go_template(chat: OllamaChatTemplate) -> OllamaTemplate | None:
    """The parsed template, or None when Ollama renders with a built-in renderer or the template is beyond the
    interpreter (such chats are counted by content plus the learned overhead)."""
    if chat.renderer:
        return None
    try:
        return OllamaTemplate(chat.template, system=chat.system)
    except GoTemplateError:
        return None


def _safe_segments(segments: Sequence[str], engine: TokenizerEngine) -> list[str]:
    """Join neighbouring segments whose boundary a tokenizer could merge across, so per-segment counts add up.

    A boundary is safe next to a special token (llama.cpp and tokenizers both split those out first), or, for
    regex pre-tokenizers, after a newline followed by a non-space character.
    """
    specials = engine.special_texts
    out: list[str] = []
    for segment in segments:
        if not out:
            out.append(segment)
            continue
        previous = out[-1]
        safe = segment.startswith(specials) or previous.endswith(specials)
        if not safe and engine.chunkable:
            safe = previous.endswith("\n") and segment[:1] != "" and not segment[:1].isspace()
        if safe:
            out.append(segment)
        else:
            out[-1] = previous + segment
    return out
