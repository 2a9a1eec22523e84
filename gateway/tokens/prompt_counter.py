"""Counting each request's prompt tokens with the best counter for its backend and model.

One counter chain per (backend, model), built on first use and kept, so tokenizers and per-message counts stay
cached. Counting never fails a request, and never leaves one uncounted: when no counter can answer, the byte
estimate (flagged as an estimate) does.

What counting may hold and do is bounded, whatever clients send:

- chains are kept for the models a backend lists or the settings name (and llama-server's one model); a chain for
  any other name (an OpenAI-compatible server's, a /kvgate/count guess) lives in a small LRU of
  ``UNLISTED_CHAINS``, so 5,000 made-up names cost 16 chains, not 5,000;
- a prompt over ``counting.exact_count_max_bytes`` is estimated, never tokenized: a 20 MiB chat costs a pass over
  its bytes, not seconds of CPU and the tokenizer's per-token memory;
- the prompts tokenized at once hold at most ``counting.max_tokenizing_bytes`` between them (see
  tokenizing_budget): 8 chats just under the exact-count limit are counted two at a time, not all at once, and one
  that finds no room within its count budget is estimated, flagged.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Protocol

from gateway.backends import Backend, BackendClient
from gateway.config.settings import Settings
from gateway.domain import KV_OPERATIONS, NO_OUTPUT_OPERATIONS, BackendKind, ParsedRequest, Prompt
from gateway.tokens import (
    CounterChain,
    CounterUnavailable,
    CountingSettings,
    TokenCount,
    count_prompt,
)
from gateway.tokens.backend_tokenize import TokenizeEndpoints
from gateway.tokens.byte_estimate import EstimateCounter
from gateway.tokens.llama_server_counter import probe_chat_template
from gateway.tokens.request_count import prompt_bytes
from gateway.tokens.tokenizing_budget import TokenizingBudget

log = logging.getLogger(__name__)

ESTIMATE_COUNTER = "estimate"
COUNTED_OPERATIONS = KV_OPERATIONS | NO_OUTPUT_OPERATIONS
UNLISTED_CHAINS = 16
"""Chains kept, least recently used first out, for model names a backend does not list."""


def counting_settings(settings: Settings) -> CountingSettings:
    c = settings.counting
    models = settings.models
    return CountingSettings(
        cache_dir=c.cache_dir.expanduser(),
        gguf_paths={name: m.gguf_path for name, m in models.items() if m.gguf_path is not None},
        tokenizer_json={name: m.tokenizer_json for name, m in models.items() if m.tokenizer_json is not None},
        chat_templates={name: m.chat_template for name, m in models.items() if m.chat_template is not None},
        tiktoken_encoding=c.tiktoken_encoding,
        tiktoken_dir=c.tiktoken_dir,
        image_tokens={name: m.image_tokens for name, m in models.items() if m.image_tokens is not None},
        default_image_tokens=c.default_image_tokens,
        estimate_bytes_per_token=c.estimate_bytes_per_token,
        estimate_safety_margin=c.estimate_safety_margin,
    )


class NoTokenizingRoom(Exception):
    """The tokenizing budget had no room for a prompt within its wait: the caller estimates instead."""


class ChainRuntime(Protocol):
    """What the prompt counter asks of a backend's runtime (gateway/runtimes/, which this package may not import):
    the chain that counts a model's tokens on that kind of server."""

    def counter_chain(self, model: str, *, client: BackendClient, settings: CountingSettings,
                      llama_server_template: str | None = None,
                      endpoints: TokenizeEndpoints | None = None) -> CounterChain: ...


class PromptCounter:
    def __init__(self, settings: Settings, runtime_for: Callable[[BackendKind], ChainRuntime]) -> None:
        self._settings = counting_settings(settings)
        self._runtime_for = runtime_for
        self._chains: dict[tuple[str, str], CounterChain] = {}
        self._unlisted: OrderedDict[tuple[str, str], CounterChain] = OrderedDict()
        self._configured = frozenset(settings.models)
        self._exact_max_bytes = int(settings.counting.exact_count_max_bytes)
        self.tokenizing = TokenizingBudget(int(settings.counting.max_tokenizing_bytes))
        self._templates: dict[str, asyncio.Future[str | None]] = {}
        self._endpoints: dict[str, TokenizeEndpoints] = {}
        """Per OpenAI-compatible backend: which tokenize endpoint it has, probed once for all its models."""
        self._slow: dict[tuple[str, str], asyncio.Future[TokenCount]] = {}
        self._warm: set[tuple[str, str]] = set()
        self._budget_s = settings.counting.count_budget_s
        c = settings.counting
        self._estimate = EstimateCounter(bytes_per_token=c.estimate_bytes_per_token,
                                         safety_margin=c.estimate_safety_margin, image_tokens=c.default_image_tokens)

    def _kept(self, backend: Backend, model: str) -> bool:
        """Whether ``model``'s chain is kept for good: a name the backend lists or the settings name."""
        if backend.runtime.serves_one_model and not model:
            return True
        return model in self._configured or backend.listed_name(model) is not None

    def _cached(self, key: tuple[str, str]) -> CounterChain | None:
        chain = self._chains.get(key)
        if chain is None:
            chain = self._unlisted.get(key)
            if chain is not None:
                self._unlisted.move_to_end(key)
        return chain

    def chains_held(self) -> int:
        """How many counter chains are kept now (listed and unlisted models)."""
        return len(self._chains) + len(self._unlisted)

    async def chain(self, backend: Backend, model: str) -> CounterChain:
        key = (backend.name, model)
        chain = self._cached(key)
        if chain is None:
            template = await self._server_template(backend) if backend.runtime.reads_server_template else None
            chain = self._cached(key)  # another request may have built it meanwhile: one chain per model
            if chain is None:
                chain = self._runtime_for(backend.kind).counter_chain(
                    model, client=backend.client, settings=self._settings,
                    llama_server_template=template, endpoints=self.endpoints(backend),
                )
                if self._kept(backend, model):
                    self._chains[key] = chain
                else:
                    self._unlisted[key] = chain
                    while len(self._unlisted) > UNLISTED_CHAINS:
                        old, _ = self._unlisted.popitem(last=False)
                        self._warm.discard(old)
                        self._slow.pop(old, None)
        return chain

    def endpoints(self, backend: Backend) -> TokenizeEndpoints:
        """What ``backend`` offers to count with (an OpenAI-compatible server's /tokenize), one per backend."""
        found = self._endpoints.get(backend.name)
        if found is None:
            found = self._endpoints[backend.name] = TokenizeEndpoints(
                backend.client, context_tokens=backend.settings.context_tokens)
        return found

    async def _server_template(self, backend: Backend) -> str | None:
        """llama-server's chat template family, asked once per backend however many requests need it at once."""
        probe = self._templates.get(backend.name)
        if probe is None:
            probe = asyncio.ensure_future(probe_chat_template(backend.client))
            self._templates[backend.name] = probe
        return await asyncio.shield(probe)

    async def count(
        self, parsed: ParsedRequest, backend: Backend, model: str | None = None, *, budget_s: float | None = None
    ) -> TokenCount:
        """The prompt length of a chat, generate, Responses or infill request: exact where a counter can, else the
        flagged estimate.

        A count that takes longer than ``budget_s`` (default ``counting.count_budget_s``: a model's tokenizer is
        being fetched and built, a llama-server is slow to answer) goes on in the background, for the requests after
        this one; this one gets the byte estimate, flagged as such, so no request waits on a tokenizer build longer
        than its budget. A request that arrives while that count is under way waits for it up to its own budget (the
        load may finish meanwhile), then counts exactly or estimates. A caller that would refuse a request on an
        estimate asks again with a longer budget, and so waits longer for the count already under way.
        """
        if parsed.operation not in COUNTED_OPERATIONS:
            raise ValueError(f"{parsed.operation} requests have no prompt to count")
        model = parsed.model if model is None else model
        key = (backend.name, model or "")
        prompt = parsed.prompt_input
        size_bytes = prompt_bytes(prompt)
        if size_bytes > self._exact_max_bytes:  # too big to tokenize within its budget: estimated, flagged
            log.info("prompt is %s bytes, over counting.exact_count_max_bytes (%s): estimated",
                     f"{size_bytes:,}", f"{self._exact_max_bytes:,}")
            return await count_prompt(prompt, self._estimate)
        chain = await self.chain(backend, model or "")
        budget = self._budget_s if budget_s is None else budget_s
        running = self._slow.get(key)
        if running is not None and not running.done():  # a load under way: it may finish within this budget
            await asyncio.wait({running}, timeout=budget)
        if key in self._warm:  # its tokenizer is loaded: no need to guard against a slow load
            try:
                return await self._exact(prompt, chain, size_bytes, budget)
            except CounterUnavailable as exc:
                log.warning("could not count the prompt: %s", exc.reason)
                return await count_prompt(prompt, self._estimate)
            except NoTokenizingRoom:
                return await self._no_room(prompt, size_bytes)
        running = self._slow.get(key)
        if running is None or running.done():
            task = asyncio.ensure_future(self._exact(prompt, chain, size_bytes, budget))
            done, _ = await asyncio.wait({task}, timeout=budget)
            if done:
                try:
                    result = task.result()
                except CounterUnavailable as exc:
                    log.warning("could not count the prompt: %s", exc.reason)
                    return await count_prompt(prompt, self._estimate)
                except NoTokenizingRoom:
                    return await self._no_room(prompt, size_bytes)
                if result.counter != ESTIMATE_COUNTER and self._cached(key) is chain:
                    self._warm.add(key)
                return result
            task.add_done_callback(functools.partial(self._settle, key))
            self._slow[key] = task
            log.info("counting for model %r on %s takes over %g s (a tokenizer loading?); estimating meanwhile",
                     model, backend.describe(), budget)
        return await count_prompt(prompt, self._estimate)

    async def _exact(self, prompt: Prompt, chain: CounterChain, size_bytes: int, wait_s: float) -> TokenCount:
        """The exact count, holding the prompt's bytes in the tokenizing budget while it runs."""
        if not await self.tokenizing.acquire(size_bytes, wait_s):  # (not ``held``: a generator a request)
            raise NoTokenizingRoom
        try:
            return await count_prompt(prompt, chain)
        finally:
            self.tokenizing.release(size_bytes)

    async def _no_room(self, prompt: Prompt, size_bytes: int) -> TokenCount:
        log.info("prompt of %s bytes estimated: counting.max_tokenizing_bytes (%s) is taken by %s bytes being "
                 "tokenized", f"{size_bytes:,}", f"{self.tokenizing.limit_bytes:,}", f"{self.tokenizing.held_bytes:,}")
        return await count_prompt(prompt, self._estimate)

    def _settle(self, key: tuple[str, str], task: asyncio.Future[TokenCount]) -> None:
        """A background count finished: its counter is warm now (or its failure is read, so asyncio does not
        report it as lost)."""
        if task.cancelled():
            return
        if task.exception() is not None:
            log.debug("background count failed: %s", task.exception())
        elif task.result().counter != ESTIMATE_COUNTER and (key in self._chains or key in self._unlisted):
            self._warm.add(key)

    async def calibrate(self, parsed: ParsedRequest, backend: Backend, model: str, observed_prompt_tokens: int,
                        counted: TokenCount | None = None) -> None:
        """Learn a model's template overhead from the prompt length its backend reported. ``counted``: the
        request's count; where it holds the contents' tokens, they are not counted again (nor is the tokenizing
        budget needed)."""
        chain = self._cached((backend.name, model))
        messages = parsed.prompt_input.messages
        if chain is None or not messages:
            return
        tools = list(parsed.prompt_input.tools)
        if counted is not None and counted.content_tokens is not None:
            chosen = [m for m in messages if isinstance(m, Mapping)]  # as count_prompt counted them
            await chain.calibrate(chosen, tools, observed_prompt_tokens, counted)
            return
        size_bytes = prompt_bytes(parsed.prompt_input)
        if size_bytes > self._exact_max_bytes:
            return
        async with self.tokenizing.held(size_bytes, wait_s=0) as got:  # no room now: learnt from a later reply
            if got:
                await chain.calibrate(list(messages), tools, observed_prompt_tokens)
