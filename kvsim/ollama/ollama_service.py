"""What Ollama does with a chat, generate or embed request once it is parsed: the transport-free half.

    options -> scheduler.acquire (load / reload / wait) -> render + truncate messages -> slot (semaphore,
    unbounded wait) -> truncate tokens -> generate -> release

``stream`` yields ``Piece`` per generated token and a final ``Finished``; a ``SimError`` raised before the first
item becomes an HTTP status, one raised later an error line (the routes decide). Counting into ``SimStats``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvsim.catalog import ModelSpec
from kvsim.clock import Clock
from kvsim.config import SimConfig
from kvsim.failures import SimError
from kvsim.gpu.vgpu import VirtualGpu
from kvsim.ollama.generation import Generator, GenRequest, GenResult, bounded_num_predict, check_slot
from kvsim.ollama.loaded import LoadedRunner
from kvsim.ollama.options import OptionError, Options, parse_options, schedule_num_ctx
from kvsim.ollama.prompting import chat_prompt, exceed_context_body, fit_tokens_e2, fit_tokens_e3
from kvsim.ollama.scheduler import OllamaScheduler
from kvsim.stats import SimStats
from kvsim.templates import Message
from kvsim.vocab import tokenizer_for

REGISTRY_PREFIX = "registry.ollama.ai/library/"


@dataclass(frozen=True)
class Inference:
    """A parsed ``/api/chat`` or ``/api/generate`` request."""

    spec: ModelSpec
    messages: tuple[Message, ...]  # the conversation, or generate's system + user turn
    raw_prompt: str | None = None  # generate with raw: the prompt as given
    context_tokens: tuple[int, ...] = ()  # generate's deprecated ``context``
    options: Mapping[str, Any] | None = None
    keep_alive_s: float | None = None
    truncate: bool = True
    shift: bool | None = None


@dataclass(frozen=True)
class Piece:
    text: str


@dataclass(frozen=True)
class Finished:
    result: GenResult
    prompt_tokens: tuple[int, ...]
    total_s: float
    load_s: float


def full_name(spec: ModelSpec) -> str:
    return REGISTRY_PREFIX + spec.name


class OllamaService:
    def __init__(
        self,
        config: SimConfig,
        models: dict[str, ModelSpec],
        vgpu: VirtualGpu,
        clock: Clock,
        stats: SimStats,
        scheduler: OllamaScheduler,
    ) -> None:
        self.config, self.models, self.vgpu, self.clock, self.stats = config, models, vgpu, clock, stats
        self.scheduler = scheduler
        self.generator = Generator(config, scheduler, vgpu, clock)

    async def warm_up(self) -> None:
        """Convert the models' vocabularies before the first request (about a second each)."""
        for spec in self.models.values():
            await asyncio.to_thread(tokenizer_for, spec, cache_dir=self.config.tokenizer_cache_dir)

    def options(self, spec: ModelSpec, raw: Mapping[str, Any] | None) -> Options:
        modelfile = {"num_ctx": spec.num_ctx_param} if spec.num_ctx_param else {}
        try:
            opts = parse_options(
                raw,
                modelfile=modelfile,
                default_num_ctx=self.config.default_num_ctx,
                context_length_env=self.config.context_length,
                embedding=spec.is_embedding,
            )
        except OptionError as exc:
            raise SimError(500, str(exc)) from None
        num_ctx = schedule_num_ctx(opts.runner.num_ctx, vision="vision" in spec.capabilities)
        return replace(opts, runner=replace(opts.runner, num_ctx=num_ctx))

    async def load(
        self, spec: ModelSpec, raw_options: Mapping[str, Any] | None, keep_alive_s: float | None, shift: bool | None
    ) -> float:
        """Schedule the model without running anything (empty prompt); returns the load duration."""
        start = self.clock.now()
        runner = await self.scheduler.acquire(
            spec, self.options(spec, raw_options), keep_alive_s, True if shift is None else shift
        )
        self.scheduler.release(runner)
        return self.clock.now() - start

    async def stream(self, inf: Inference) -> AsyncGenerator[Piece | Finished, None]:
        self.stats.requests += 1
        try:
            async for item in self._stream(inf):
                yield item
        except SimError:
            self.stats.failed += 1
            raise
        self.stats.completed += 1

    async def _stream(self, inf: Inference) -> AsyncGenerator[Piece | Finished, None]:
        start = self.clock.now()
        opts = self.options(inf.spec, inf.options)
        shift = True if inf.shift is None else inf.shift
        runner = await self.scheduler.acquire(inf.spec, opts, inf.keep_alive_s, shift)
        try:
            load_s = self.clock.now() - start
            tokenizer = tokenizer_for(inf.spec, cache_dir=self.config.tokenizer_cache_dir)
            tokens, dropped = self._prompt_tokens(inf, runner, tokenizer.encode)
            await self._take_slot(runner)
            try:
                check_slot(runner)
                fitted = self._fit(inf, runner, opts, tokens, shift)
                if dropped or len(fitted) < len(tokens):
                    self.stats.truncated_prompts += 1
                request = GenRequest(
                    prompt_tokens=fitted,
                    num_predict=bounded_num_predict(opts.num_predict, runner.num_ctx),
                    context_room=self._room(runner, fitted, shift),
                    request_seed=opts.seed,
                )
                result = GenResult()
                async for text in self.generator.run(runner, request, tokenizer, result):
                    yield Piece(text)
                yield Finished(result, tuple(fitted), self.clock.now() - start, load_s)
            finally:
                runner.slots.release()
        finally:
            self.scheduler.release(runner)

    async def embed(
        self,
        spec: ModelSpec,
        inputs: list[str],
        *,
        raw_options: Mapping[str, Any] | None,
        keep_alive_s: float | None,
        truncate: bool,
    ) -> tuple[list[list[float]], int, float]:
        """Embeddings (normalized, deterministic per text), the prompt token count, and the load time."""
        start = self.clock.now()
        opts = self.options(spec, raw_options)
        runner = await self.scheduler.acquire(spec, opts, keep_alive_s, True)
        try:
            load_s = self.clock.now() - start
            if not inputs:
                return [], 0, load_s
            tokenizer = tokenizer_for(spec, cache_dir=self.config.tokenizer_cache_dir)
            limit = min(opts.runner.num_ctx, spec.n_ctx_train) - 1  # minus the EOS the runner appends
            counts = []
            for text in inputs:
                n = len(tokenizer.encode(text))
                if n > limit and not truncate:
                    raise SimError(400, "the input length exceeds the context length")
                counts.append(min(n, limit))
            await self._take_slot(runner)
            try:
                check_slot(runner)
                await self.clock.sleep(sum(counts) / self.config.prompt_tokens_per_s)
            finally:
                runner.slots.release()
            return [embedding(spec, text) for text in inputs], sum(counts), load_s
        finally:
            self.scheduler.release(runner)

    async def _take_slot(self, runner: LoadedRunner) -> None:
        if not runner.slots.locked():
            await runner.slots.acquire()
            return
        self.stats.wait_started()  # all num_parallel slots busy: wait, without bound
        try:
            await runner.slots.acquire()
        finally:
            self.stats.wait_ended()

    def _prompt_tokens(
        self, inf: Inference, runner: LoadedRunner, encode: Callable[[str], list[int]]
    ) -> tuple[list[int], int]:
        spec = inf.spec
        if inf.raw_prompt is not None:
            return list(encode(inf.raw_prompt)), 0
        rendered = chat_prompt(
            spec.template,
            tokenizer_for(spec, cache_dir=self.config.tokenizer_cache_dir),
            inf.messages,
            num_ctx=runner.num_ctx,
            truncate=inf.truncate,
            vision="vision" in spec.capabilities,
        )
        tokens = rendered.tokens
        if inf.context_tokens:
            head = tokens[:1] if spec.add_bos else []
            tokens = head + list(inf.context_tokens) + tokens[len(head) :]
        return tokens, rendered.dropped_messages

    def _fit(self, inf: Inference, runner: LoadedRunner, opts: Options, tokens: list[int], shift: bool) -> list[int]:
        if self.config.era == "e2":
            return fit_tokens_e2(tokens, num_ctx=runner.num_ctx, num_keep=opts.num_keep, truncate=inf.truncate)
        fitted = fit_tokens_e3(
            tokens,
            num_ctx=runner.num_ctx,
            num_keep=opts.num_keep,
            adds_bos=inf.spec.add_bos,
            shift=shift,
            truncate=inf.truncate,
        )
        if len(fitted) >= runner.slot_ctx:  # llama-server's own check, relayed by Ollama as a string
            raise SimError(400, exceed_context_body(len(fitted), runner.slot_ctx))
        return fitted

    def _room(self, runner: LoadedRunner, tokens: list[int], shift: bool) -> int | None:
        if shift:
            return None
        if self.config.era == "e2":
            return max(runner.num_ctx - len(tokens), 0)
        return max(runner.slot_ctx - 1 - len(tokens), 0)


def embedding(spec: ModelSpec, text: str) -> list[float]:
    """A unit vector of the model's width, derived from the text alone."""
    seed = hashlib.sha256(f"{spec.name}\x00{text}".encode()).digest()
    values = [((seed[i % 32] ^ (i * 131)) % 251 - 125) / 125 for i in range(spec.arch.n_embd)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 6) for v in values]
