"""The net-effect benchmark's matrix: every cell a backend set-up, a workload, and how kvgate is started in front.

kvgate is set up as a new user sets it up: the backends' URLs (and kinds) and nothing else, every other setting at
its default. Where a cell needs more, it says so in ``setup`` and the table prints it: a ``vram`` source for the
cells about GPU memory (without one kvgate cannot see the GPU, and says so), ``parallel`` and ``context_tokens``
for an OpenAI-compatible server (which reports no KV layout).

The simulators run at ``TIME_SCALE`` (simulated seconds per real second): an answer of 60 tokens at 60 tokens/s
takes 0.2 s of real time at 5x. kvgate runs in real time, as in production.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from bench.net_effect_client import Request
from bench.net_effect_workload import Burst, Chats, Foreign, Phases, Workload, openai_chat, words
from kvsim.config import SimConfig
from kvsim.gpu.vgpu import GIB
from kvsim.workload.multi_model import multi_model_script, multi_model_sim_config
from kvsim.workload.workload import Call, _body

EXPORTER = "<the simulator's /sim/metrics>"
"""A backend setting's value meaning the simulator's own GPU exporter URL (filled in when it runs)."""
Kind = Literal["ollama", "llama-server", "openai"]
MODEL = "llama3.1:8b"
TIME_SCALE = 5.0
"""The simulators' speed-up. kvgate's own costs are real time (a forwarded request about a millisecond, the probes
after a model load tens of milliseconds), so the faster the simulator, the larger they weigh against the work: at
5x a load of 2 simulated seconds takes 0.4 s, an answer of 100 tokens 0.33 s."""


@dataclass(frozen=True)
class Sim:
    """A simulated backend (kvsim); ``kind`` is what kvgate is told it is; ``warm`` models are loaded before the
    run (the host where a model is already resident); ``settings`` are kvgate's settings for it beyond its URL."""

    config: SimConfig
    kind: Kind = "ollama"
    warm: tuple[str, ...] = ()
    settings: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class RealLlamaServer:
    """llama.cpp's llama-server with a tiny random-weight model and the real Llama-3 tokenizer."""

    args: tuple[str, ...]
    kind: Kind = "llama-server"
    settings: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Dead:
    """A backend URL with nothing listening (connection refused)."""

    kind: Kind = "ollama"
    settings: tuple[tuple[str, Any], ...] = ()


Backend = Sim | RealLlamaServer | Dead


@dataclass(frozen=True)
class Cell:
    """One row pair of the table: ``workload`` straight at ``backends``, then through kvgate in front of them."""

    name: str
    case: str
    """What it reproduces, in a few words."""
    backends: tuple[Backend, ...]
    workload: Workload
    setup: str = "backend URLs only"
    foreign: tuple[Foreign, ...] = ()
    kvgate: tuple[tuple[str, Any], ...] = ()
    """Top-level kvgate settings beyond the backends (none for a new user)."""
    waits_for: str | None = None
    """An issue that must land before this cell can meet the target: printed with its figure, marked, not failed."""
    target: Literal["net", "fast_errors"] = "net"
    models: tuple[str, ...] = field(default=())
    """Models kvgate's counters are warmed for before the run (their tokenizers converted once, as in a server
    that has been up a while)."""

    @property
    def real(self) -> bool:
        return any(isinstance(b, RealLlamaServer) for b in self.backends)


def _sim(**changes: Any) -> SimConfig:
    base = SimConfig(models=(MODEL,), load_s=2.0, time_scale=TIME_SCALE, gen_tokens_per_s=60.0,
                     prompt_tokens_per_s=4000.0, min_response_tokens=40, max_response_tokens=120)
    return replace(base, **changes)


def _llama_sim(**changes: Any) -> SimConfig:
    base = SimConfig(mode="llama-server", ctx_size=4096, n_parallel=-1, load_s=0.0, time_scale=TIME_SCALE,
                     gen_tokens_per_s=60.0, prompt_tokens_per_s=4000.0, min_response_tokens=30,
                     max_response_tokens=80)
    return replace(base, **changes)


def _call_request(call: Call) -> Request:
    path, body = _body(call)
    return Request(path, body, "openai" if path.startswith("/v1") else "ollama", False)


def _calls(phases: list[list[Call]]) -> Phases:
    return Phases(tuple(Burst(tuple(_call_request(call) for call in phase)) for phase in phases))


def _new_conversations(count: int, *, seed: int, prompt_words: int = 80) -> Burst:
    rng = random.Random(seed)
    return Burst(tuple(
        Request("/api/chat", {"model": MODEL, "stream": i % 2 == 1, "messages": [
            {"role": "user", "content": f"Conversation {i}: {words(rng, prompt_words)}"}]}, "ollama", i % 2 == 1)
        for i in range(count)))


def _long_prompt(rng: random.Random, tokens: int) -> str:
    return words(rng, tokens)


def slot_cells() -> Iterator[Cell]:
    for slots in (1, 2, 4):
        yield Cell(f"ollama, {slots} slot{'s' if slots > 1 else ''}",
                   f"OLLAMA_NUM_PARALLEL={slots}: 4 concurrent 10-turn chats, half streamed, no limits",
                   (Sim(_sim(num_parallel=slots)),), Chats(clients=4, turns=10, model=MODEL), models=(MODEL,))


def host_cells() -> Iterator[Cell]:
    for hosts in (2, 3):
        for warm in (True, False):
            backends = tuple(Sim(_sim(load_s=3.0, min_response_tokens=60, max_response_tokens=160),
                                 warm=(MODEL,) if warm and i == 0 else ()) for i in range(hosts))
            where = "the first host only" if warm else "no host"
            yield Cell(f"{hosts} ollama hosts, {'warm' if warm else 'cold'}",
                       f"a burst of 8 new conversations; the model loaded on {where}",
                       backends, _new_conversations(8, seed=hosts * 10 + warm), models=(MODEL,))


def offload_cell() -> Cell:
    return Cell("load with CPU offload", "llama.cpp's fit on (Ollama v0.30+); a foreign process holds 20 of 24 GiB; "
                "12 requests", (Sim(_sim(llama_fit=True), settings=(("vram", EXPORTER),)),),
                _new_conversations(12, seed=5, prompt_words=40), setup="backend URL + vram (the simulator's exporter)",
                foreign=(Foreign(20 * GIB),), models=(MODEL,))


def refusal_cells() -> Iterator[Cell]:
    rng = random.Random(3)
    long_prompts = tuple(openai_chat("served-model", [{"role": "user", "content": _long_prompt(rng, 2600)}],
                                     stream=i % 2 == 1, max_tokens=200) for i in range(12))
    yield Cell("openai-compatible, 2,600-token prompts",
               "4,096-token context: 12 prompts of ~2,600 tokens, max_tokens 200",
               (Sim(_llama_sim(n_parallel=1), kind="openai",
                    settings=(("parallel", 1), ("context_tokens", 4096))),),
               Burst(long_prompts), setup="backend URL + parallel 1 + context_tokens 4096")
    yield Cell("n: 2 on Ollama /v1", "Ollama answers one choice whatever n says: 4 chats x 5 turns with n: 2",
               (Sim(_sim()),), Chats(clients=4, turns=5, model=MODEL, route="openai", extra=(("n", 2),)),
               models=(MODEL,))
    summarizer = tuple(openai_chat(MODEL, [
        {"role": "system", "content": "Summarize this partial conversation."},
        {"role": "user", "content": _long_prompt(rng, 10_000)}], stream=False) for _ in range(2))
    yield Cell("one message past the context", "aider's history summarizer: one 10,000-token message, "
               "OLLAMA_CONTEXT_LENGTH=8192", (Sim(_sim(context_length=8192)),), Burst(summarizer), models=(MODEL,))


def _batch(rng: random.Random, prompts: int, tokens: int, max_tokens: int, path: str) -> Request:
    """A multi-prompt batch whose answers run to their limit (``ignore_eos``, as bench/no_escape's bursts do), so
    that what the pool must hold is what the limit says."""
    body: dict[str, Any] = {"prompt": [_long_prompt(rng, tokens) for _ in range(prompts)], "ignore_eos": True}
    body["n_predict" if path == "/completion" else "max_tokens"] = max_tokens
    return Request(path, body, "llama" if path == "/completion" else "openai", False)


def batch_cells() -> Iterator[Cell]:
    rng = random.Random(4)
    yield Cell("multi-prompt batch, alone", "/v1/completions with 4 prompts of ~900 tokens, max_tokens 400, on a "
               "unified 4,096-cell pool", (Sim(_llama_sim(), kind="llama-server"),),
               Burst((_batch(rng, 4, 900, 400, "/v1/completions"),)))
    yield Cell("multi-prompt batches, a burst", "8 batches of 2 prompts (~600 tokens, n_predict 300) on /completion",
               (Sim(_llama_sim(), kind="llama-server"),),
               Burst(tuple(_batch(rng, 2, 600, 300, "/completion") for _ in range(8))))
    yield Cell("multi-prompt batches that fit", "4 rounds of 4 batches of 2 prompts (~300 tokens, n_predict 100) "
               "on /v1/completions: every round fits the pool", (Sim(_llama_sim(), kind="llama-server"),),
               Phases(tuple(Burst(tuple(_batch(rng, 2, 300, 100, "/v1/completions") for _ in range(4)))
                            for _ in range(4))))


def embedding_cell() -> Cell:
    """Embedding batches beside chats on one llama-server started with --embeddings: every input is a task holding
    a slot and its cells in the unified pool the chats use."""
    rng = random.Random(8)
    def round_(index: int) -> Burst:
        chats = [openai_chat(None, [{"role": "user", "content": _long_prompt(rng, 900)}], stream=i % 2 == 1,
                             max_tokens=600, ignore_eos=True) for i in range(2)]
        embeds = [Request("/v1/embeddings", {"input": [_long_prompt(rng, 700) for _ in range(3)]}, "embed")
                  for _ in range(2)]
        return Burst(tuple(item for pair in zip(chats, embeds, strict=True) for item in pair))

    return Cell("embeddings beside chats", "llama-server --embeddings -c 4096: 4 rounds of 2 chats (~900 + 600 "
                "tokens) and 2 embedding batches of 3 x ~700 tokens at once",
                (Sim(_llama_sim(embeddings=True), kind="llama-server"),), Phases(tuple(round_(i) for i in range(4))))


def unified_cells() -> Iterator[Cell]:
    short = _llama_sim(min_response_tokens=30, max_response_tokens=80)
    yield Cell("unified pool, no limit, short answers", "llama-server -c 4096, -np omitted (4 slots share 4,096 "
               "cells): 8 chats x 3 turns of ~500 tokens, no max_tokens, answers of 30-80 tokens",
               (Sim(short, kind="llama-server"),),
               Chats(clients=8, turns=3, model=None, route="openai", first_words=480, turn_words=20),
               waits_for="issue 25 (elastic reservations)")
    long = _llama_sim(min_response_tokens=1200, max_response_tokens=1600)
    yield Cell("unified pool, no limit, long answers", "the same with answers of 1,200-1,600 tokens",
               (Sim(long, kind="llama-server"),),
               Chats(clients=8, turns=2, model=None, route="openai", first_words=480, turn_words=20))


GPU_SETUP = "backend URL + vram (the simulator's exporter); load_wait_s in simulated time"


FIT_OFF_SETUP = " + cpu_offload off (the backend runs with LLAMA_ARG_FIT=off)"


def _scaled_residency(config: SimConfig) -> tuple[tuple[str, Any], ...]:
    """kvgate's ``residency.load_wait_s`` (30 s by default) measured in the simulator's time, as ``kvgate demo``
    does: against a simulator 8x faster than real time, 30 real seconds would be 4 simulated minutes of waiting for
    memory."""
    return (("residency", {"load_wait_s": max(1.0, 30.0 / config.time_scale)}),)


def gpu_cells() -> Iterator[Cell]:
    phases, events = multi_model_script()
    foreign = tuple(Foreign(event.nbytes, phase=index, ends_phase=next(
        (i for i, evs in events.items() for e in evs if e.nbytes == 0 and e.name == event.name), None))
        for index, evs in events.items() for event in evs if event.nbytes > 0)
    for fit in (False, True):
        config = replace(multi_model_sim_config(time_scale=8.0), llama_fit=fit)
        settings: tuple[tuple[str, Any], ...] = (("vram", EXPORTER),) + (() if fit else (("cpu_offload", "off"),))
        yield Cell(f"three models, fit {'on' if fit else 'off'}", "llama3.1:8b, qwen2.5:32b, gemma3:27b on 24 GiB, "
                   "users switching; a foreign process takes 8 GiB halfway", (Sim(config, settings=settings),),
                   _calls(phases), foreign=foreign, setup=GPU_SETUP + ("" if fit else FIT_OFF_SETUP),
                   kvgate=_scaled_residency(config), models=config.models)
    config = _sim(num_parallel=2, llama_fit=False, load_s=3.0)
    chats = Chats(clients=4, turns=8, model=MODEL, extra=(("options", {"num_ctx": 65536}),), extra_for=(1, 3), seed=7)
    yield Cell("foreign process mid-run", "4 chats of 8 turns, two asking num_ctx 65536 (Ollama reloads for them); "
               "a foreign process takes 6 GiB 0.5 s in; llama.cpp's fit off",
               (Sim(config, warm=(MODEL,), settings=(("vram", EXPORTER), ("cpu_offload", "off"))),), chats,
               foreign=(Foreign(6 * GIB, at_s=0.5),), setup=GPU_SETUP + FIT_OFF_SETUP, kvgate=_scaled_residency(config),
               models=(MODEL,))


def dead_cell() -> Cell:
    return Cell("dead backend", "connection refused: 8 chats", (Dead(),), _new_conversations(8, seed=9),
                target="fast_errors")


def real_cells() -> Iterator[Cell]:
    rng = random.Random(6)
    long_chats = tuple(openai_chat(None, [{"role": "user", "content": _long_prompt(rng, 1400)}], stream=i % 2 == 1,
                                   max_tokens=1500) for i in range(4))
    yield Cell("real llama-server, 4 long chats", "-c 4096, -np omitted: 4 chats of ~1,400 prompt tokens, max_tokens "
               "1,500 (llama-server.md section 7)", (RealLlamaServer(("-c", "4096")),), Burst(long_chats))
    yield Cell("real llama-server, multi-prompt batch", "/completion with 3 prompts of ~1,000 tokens, n_predict 800, "
               "-c 4096 unified", (RealLlamaServer(("-c", "4096")),),
               Burst((_batch(rng, 3, 1000, 800, "/completion"),)))


def all_cells() -> list[Cell]:
    return [*slot_cells(), *host_cells(), offload_cell(), *refusal_cells(), *batch_cells(), embedding_cell(),
            *unified_cells(), *gpu_cells(), dead_cell(), *real_cells()]


QUICK = ("ollama, 2 slots", "2 ollama hosts, cold", "n: 2 on Ollama /v1", "dead backend")
"""The cells of ``--quick`` (the test suite's smoke run)."""
