"""Evaluating one prompt and generating its answer on an Ollama-mode runner, at the configured speeds.

Deterministic: the answer's length and tokens come from an RNG seeded with the simulator's seed, the request's
``seed`` option and the prompt tokens, so the same request gets the same answer whatever else is running.
Tokens are drawn from the model's real vocabulary (``SimTokenizer.word_ids``).

Stops, as llama-server reports them: ``stop`` when the drawn answer ends, ``length`` when ``num_predict`` (after
Ollama's bound of 10 x num_ctx) or, with context shift off, the slot runs out first.

Failures mid-way: the runner's GPU oversubscribed (a foreign process took memory) crashes the runner at its
next decode step; in dynamic-KV mode each token's KV is allocated as it is produced and a full GPU fails the
request with PyTorch's ``CUDA out of memory``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from kvsim.clock import Clock
from kvsim.config import SimConfig
from kvsim.failures import SimError, runtime_oom, stopped_runner, torch_oom
from kvsim.gpu.kv_cache import AttentionLayers, bytes_per_token
from kvsim.gpu.vgpu import VirtualGpu
from kvsim.ollama.loaded import LoadedRunner
from kvsim.ollama.scheduler import OllamaScheduler
from kvsim.vocab import SimTokenizer


@dataclass
class GenResult:
    done_reason: str = "stop"
    prompt_eval_count: int = 0
    eval_count: int = 0
    prompt_eval_s: float = 0.0
    eval_s: float = 0.0
    token_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class GenRequest:
    prompt_tokens: list[int]
    num_predict: int  # already bounded (boundedNumPredict)
    context_room: int | None  # tokens the slot can still take; None with context shift
    request_seed: int


def bounded_num_predict(num_predict: int, num_ctx: int) -> int:
    """``boundedNumPredict``: -1 or more than 10 x num_ctx becomes 10 x num_ctx."""
    limit = 10 * num_ctx
    return limit if num_predict < 0 or num_predict > limit else num_predict


def answer_rng(config_seed: int, request_seed: int, model: str, prompt_tokens: list[int]) -> random.Random:
    digest = hashlib.sha256(f"{config_seed}:{request_seed}:{model}:{prompt_tokens}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


class Pacer:
    """Sleeps so that work accounted with ``advance`` takes its simulated time (short waits are batched)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.start_s = clock.now()
        self.budget_s = 0.0

    async def advance(self, seconds: float) -> None:
        self.budget_s += seconds
        lag = self.start_s + self.budget_s - self.clock.now()
        if lag >= self.clock.granularity():
            await self.clock.sleep(lag)


class Generator:
    def __init__(self, config: SimConfig, sched: OllamaScheduler, vgpu: VirtualGpu, clock: Clock) -> None:
        self.config, self.sched, self.vgpu, self.clock = config, sched, vgpu, clock

    async def run(
        self, runner: LoadedRunner, req: GenRequest, tokenizer: SimTokenizer, result: GenResult
    ) -> AsyncGenerator[str, None]:
        """Yield the text of each generated token; ``result`` holds the counts when the iterator ends."""
        cfg = self.config
        rng = answer_rng(cfg.seed, req.request_seed, runner.spec.name, req.prompt_tokens)
        wanted = rng.randint(cfg.min_response_tokens, cfg.max_response_tokens)
        cap = min(req.num_predict, req.context_room if req.context_room is not None else req.num_predict)
        n_tokens = min(wanted, max(cap, 0))
        result.done_reason = "stop" if wanted <= cap else "length"
        result.prompt_eval_count = len(req.prompt_tokens)
        per_token = self._dynamic_bytes_per_token(runner)
        held = 0
        try:
            self._check(runner)
            held += self._grow(runner, per_token * len(req.prompt_tokens))
            pacer = Pacer(self.clock)
            await pacer.advance(len(req.prompt_tokens) / cfg.prompt_tokens_per_s)
            self._check(runner)
            result.prompt_eval_s = self.clock.now() - pacer.start_s
            words = tokenizer.word_ids()
            gen_start = self.clock.now()
            for _ in range(n_tokens):
                held += self._grow(runner, per_token)
                await pacer.advance(1 / cfg.gen_tokens_per_s)
                self._check(runner)
                token_id = words[rng.randrange(len(words))]
                result.token_ids.append(token_id)
                result.eval_count += 1
                result.eval_s = self.clock.now() - gen_start
                yield tokenizer.piece(token_id)
        finally:
            if held and not runner.crashed and not runner.unloaded:
                self.vgpu.release(runner.pid, {runner.main_device: held})
                runner.dynamic_bytes -= held

    def _dynamic_bytes_per_token(self, runner: LoadedRunner) -> int:
        if not self.config.dynamic_kv or runner.spec.is_embedding:
            return 0
        cache = self.config.cache_type
        return bytes_per_token(AttentionLayers.of(runner.spec), cache, cache)

    def _grow(self, runner: LoadedRunner, nbytes: int) -> int:
        if nbytes <= 0:
            return 0
        device = runner.main_device
        failure = self.vgpu.try_allocate(runner.pid, {device: nbytes})
        if failure is not None:
            total = self.vgpu.devices[device].total_bytes
            raise torch_oom(device, nbytes, total, self.vgpu.free_bytes(device))
        runner.dynamic_bytes += nbytes
        return nbytes

    def _check(self, runner: LoadedRunner) -> None:
        """A decode step on a GPU that other processes have oversubscribed crashes the runner."""
        if runner.crashed:
            raise runtime_oom()
        if self.config.dynamic_kv:
            return
        if any(self.vgpu.oversubscribed(device) for device in runner.placement):
            self.sched.crash(runner)
            raise runtime_oom()


def check_slot(runner: LoadedRunner) -> None:
    """A request that got a slot on a runner that has since died (``model runner has unexpectedly stopped``)."""
    if runner.crashed or runner.unloaded:
        raise stopped_runner()
    if runner.error is not None:
        raise SimError(runner.error.status, runner.error.message)
