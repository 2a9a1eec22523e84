"""llama-server's slots and KV pool (``tools/server/server-context.cpp``), at a scale the real tiny model can't reach.

Theory of operation
-------------------
One model is loaded at start: weights + the KV cache for ``-c`` cells + compute, on the virtual GPU. Requests get
one of ``n_slots`` slots; more wait in an unbounded FIFO (the "deferred" queue) with no headers sent::

    split KV (-np N):        | slot 0: n_ctx/N cells | slot 1 | ... |     each sequence stays in its own slot
    unified KV (-np auto):   | one pool of n_ctx cells, shared  |      every slot may grow to n_ctx

A prompt of at least the slot's n_ctx is refused with 400 ``exceed_context_size_error``. Cells are taken as the
prompt is processed (micro-batches of ``N_UBATCH``) and one per generated token. With a unified pool, when a
sequence needs a cell and none is free (llama.cpp halves its batch down to 1 first), **every processing slot**
fails with 500 ``Context size has been exceeded.`` and its cells are cleared. A slot that fills stops with
``finish_reason: "length"`` (context shift is off by default). Cells of finished sequences stay cached in their
slot but are purged whenever the pool needs them, so they are not counted as used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gateway.support.gguf_reader import read_gguf_metadata
from kvsim.catalog import ModelSpec
from kvsim.clock import Clock
from kvsim.config import SimConfig
from kvsim.failures import SimError
from kvsim.gpu.kv_cache import AttentionLayers, KvCells, kv_bytes, llama_server_cells
from kvsim.gpu.load_cost import LoadCost, buffers, compute_bytes, place
from kvsim.gpu.vgpu import VirtualGpu
from kvsim.ollama.generation import Pacer, answer_rng
from kvsim.stats import SimStats
from kvsim.vocab import VOCAB_DIR, SimTokenizer, tokenizer_for

N_UBATCH = 512
CONTEXT_EXCEEDED = "Context size has been exceeded."
NO_EOS = 2**31 - 1  # ignore_eos: the answer never ends by itself


class ContextExceeded(SimError):
    def __init__(self) -> None:
        super().__init__(500, CONTEXT_EXCEEDED)


class ExceedContextSize(SimError):
    """A prompt of at least the slot's context (checked when the slot starts the task)."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(
            400,
            f"request ({n_prompt_tokens} tokens) exceeds the available context size "
            f"({n_ctx} tokens), try increasing it",
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class StartupFailed(RuntimeError):
    """The model does not fit the virtual GPU at start (llama-server would abort)."""


@dataclass(eq=False)
class Slot:
    id: int
    n_ctx: int
    processing: bool = False
    id_task: int = -1
    cells: int = 0  # cells this sequence holds (prompt + generated)
    n_prompt_tokens_processed: int = 0
    n_decoded: int = 0
    n_predict: int = -1
    stream: bool = False
    failed: SimError | None = None


@dataclass
class ServerResult:
    content_ids: list[int] = field(default_factory=list)
    finish_reason: str = "stop"  # stop | length
    stop_type: str = "eos"  # eos | limit
    n_prompt: int = 0
    prompt_s: float = 0.0
    predicted_s: float = 0.0
    id_slot: int = 0


def _server_template(spec: ModelSpec) -> str:
    """The GGUF's own template; llama-server falls back to chatml when the file carries none."""
    if spec.vocab is None:
        return spec.template
    return spec.template if _has_chat_template(spec.vocab) else "chatml"


@functools.lru_cache(maxsize=16)
def _has_chat_template(vocab: str) -> bool:
    """Whether the vocabulary file carries a chat template (read once per process: a GGUF read takes ~0.25 s)."""
    return "tokenizer.chat_template" in read_gguf_metadata(VOCAB_DIR / f"ggml-vocab-{vocab}.gguf").values


class LlamaServerEngine:
    def __init__(self, config: SimConfig, spec: ModelSpec, vgpu: VirtualGpu, clock: Clock, stats: SimStats) -> None:
        self.config, self.spec, self.vgpu, self.clock, self.stats = config, spec, vgpu, clock, stats
        auto = config.n_parallel == -1
        n_slots = 4 if auto else config.n_parallel
        unified = auto if config.kv_unified is None else config.kv_unified
        layers = AttentionLayers.of(spec)
        self.cells: KvCells = llama_server_cells(layers, ctx_size=config.ctx_size, n_parallel=n_slots, unified=unified)
        self.slots = [Slot(id=i, n_ctx=self.cells.slot_ctx) for i in range(n_slots)]
        self._free_slots: asyncio.Queue[Slot] = asyncio.Queue()
        for slot in self.slots:
            self._free_slots.put_nowait(slot)
        self._next_task = 0
        self.deferred = 0
        cache = config.cache_type
        self.kv_bytes = kv_bytes(layers, self.cells, cache, cache)
        self.total_bytes = spec.weights.gpu_bytes + self.kv_bytes + compute_bytes(spec, N_UBATCH)
        self.pid = vgpu.spawn(f"llama-server {spec.name}")
        free = {d: vgpu.free_bytes(d) for d in sorted(vgpu.devices)}
        cost = LoadCost(spec.weights.gpu_bytes, self.kv_bytes, compute_bytes(spec, N_UBATCH))
        failure = vgpu.try_allocate_buffers(self.pid, buffers(cost, place(self.total_bytes, self.total_bytes, free)))
        if failure is not None:
            vgpu.kill(self.pid)
            raise StartupFailed(
                f"{spec.name} with -c {config.ctx_size} needs {self.total_bytes} bytes; "
                f"GPU {failure.device} has {failure.free_bytes} free"
            )
        self.tokenizer: SimTokenizer = tokenizer_for(spec, cache_dir=config.tokenizer_cache_dir)
        self.template = _server_template(spec)

    @property
    def unified(self) -> bool:
        return self.cells.unified

    @property
    def pool_used_cells(self) -> int:
        return sum(s.cells for s in self.slots if s.processing)

    def close(self) -> None:
        self.vgpu.kill(self.pid)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Slot]:
        """Wait (without bound) for an idle slot."""
        if self._free_slots.empty():
            self.deferred += 1
            self.stats.wait_started()
            try:
                slot = await self._free_slots.get()
            finally:
                self.deferred -= 1
                self.stats.wait_ended()
        else:
            slot = self._free_slots.get_nowait()
        self._next_task += 1
        slot.processing, slot.id_task, slot.failed = True, self._next_task, None
        slot.cells = slot.n_prompt_tokens_processed = slot.n_decoded = 0
        try:
            yield slot
        finally:
            slot.processing = False
            self._free_slots.put_nowait(slot)

    async def run(
        self, slot: Slot, prompt: list[int], n_predict: int, result: ServerResult, *, ignore_eos: bool = False
    ) -> AsyncIterator[int]:
        """Process the prompt, then yield generated token ids; raises SimError as llama-server fails them.

        The answer ends at its drawn length (the model's EOS) unless ``ignore_eos``; then only ``n_predict`` or a
        full slot stops it."""
        cfg = self.config
        result.n_prompt, result.id_slot, slot.n_predict = len(prompt), slot.id, n_predict
        if len(prompt) >= slot.n_ctx:
            raise ExceedContextSize(len(prompt), slot.n_ctx)
        if not prompt:  # "empty prompt - releasing slot": an empty answer, nothing generated
            return
        pacer = Pacer(self.clock)
        await self._process_prompt(slot, prompt, pacer)
        result.prompt_s = self.clock.now() - pacer.start_s
        rng = answer_rng(cfg.seed, -1, self.spec.name, prompt)
        wanted = NO_EOS if ignore_eos else rng.randint(cfg.min_response_tokens, cfg.max_response_tokens)
        limit = wanted if n_predict < 0 else min(wanted, n_predict)
        words = self.tokenizer.word_ids()
        gen_start = self.clock.now()
        while slot.n_decoded < limit:
            if slot.cells + 1 >= slot.n_ctx:
                result.finish_reason, result.stop_type = "length", "limit"
                break
            self._take_cells(slot, 1)
            await pacer.advance(1 / cfg.gen_tokens_per_s)
            self._raise_if_failed(slot)
            slot.n_decoded += 1
            token = words[rng.randrange(len(words))]
            result.content_ids.append(token)
            result.predicted_s = self.clock.now() - gen_start
            yield token
        else:
            if limit < wanted:
                result.finish_reason, result.stop_type = "length", "limit"

    async def process(self, slot: Slot, prompt: list[int], result: ServerResult) -> None:
        """An embedding or rerank task: its prompt processed (taking its cells, as a completion's does), nothing
        generated; the slot is released after it."""
        result.n_prompt, result.id_slot = len(prompt), slot.id
        if len(prompt) >= slot.n_ctx:
            raise ExceedContextSize(len(prompt), slot.n_ctx)
        pacer = Pacer(self.clock)
        await self._process_prompt(slot, prompt, pacer)
        result.prompt_s = self.clock.now() - pacer.start_s

    async def _process_prompt(self, slot: Slot, prompt: list[int], pacer: Pacer) -> None:
        while slot.n_prompt_tokens_processed < len(prompt):
            chunk = min(N_UBATCH, len(prompt) - slot.n_prompt_tokens_processed)
            taken = self._take_cells(slot, chunk)
            slot.n_prompt_tokens_processed += taken
            await pacer.advance(taken / self.config.prompt_tokens_per_s)
            self._raise_if_failed(slot)

    def _take_cells(self, slot: Slot, wanted: int) -> int:
        """Cells for the next micro-batch: as many as fit; none at all fails every processing slot."""
        self._raise_if_failed(slot)
        if not self.unified:
            slot.cells += wanted
            return wanted
        free = self.cells.n_ctx - self.pool_used_cells
        taken = min(wanted, free)
        if taken <= 0:
            self._fail_all()
            self._raise_if_failed(slot)
        slot.cells += taken
        return taken

    def _fail_all(self) -> None:
        failing = [s for s in self.slots if s.processing and s.failed is None]
        self.stats.context_exceeded += len(failing)
        self.stats.event(self.clock.now(), "context_exceeded", slots=[s.id for s in failing])
        for s in failing:
            s.failed = ContextExceeded()
            s.cells = 0

    @staticmethod
    def _raise_if_failed(slot: Slot) -> None:
        if slot.failed is not None:
            raise slot.failed
