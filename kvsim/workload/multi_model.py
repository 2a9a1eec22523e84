"""The demo's multi-model phase: three models that don't fit one 24 GiB GPU together, users taking turns between
them, and a foreign process that takes 8 GiB halfway through.

Models (Ollama's own sizes at OLLAMA_NUM_PARALLEL=2 and its 32768-token default on 24 GiB, ``kvsim.gpu.load_cost``)::

    llama3.1:8b    12.6 GiB   (4.3 GiB of weights)
    qwen2.5:32b    34.4 GiB   (18.1 GiB of weights: even at 4096 tokens it needs 20.4 GiB)
    gemma3:27b     22.1 GiB   (15.4 GiB of weights, sliding-window KV)

Rounds, each three phases of a few concurrent requests to one model (a phase starts when the previous one ended)::

    llama (alice, two turns at once) -> qwen (bob: one client leaves num_ctx unset, one asks 16384) -> gemma (carol)

    round 1   the GPU to themselves
    round 2   after its llama phase, halfway through, a training job takes 8 GiB of the GPU (a foreign process)
    round 3   its llama phase still shares the GPU with the job, which ends before the qwen phase

Straight at Ollama: bob's num_ctx 16384 on qwen2.5:32b (26.4 GiB) can't load, and while the job holds its 8 GiB
qwen and gemma can't load at any context Ollama tries: out-of-memory failures (500s, each after a load attempt).
Through kvgate: qwen loads at the largest context that fits (the client's num_ctx follows it), and while the job
holds its 8 GiB the loads that can't fit are refused at once (503 ``gpu_memory_exhausted`` with Retry-After), the
model that fits (llama) keeps serving.

The job starts while llama (12.6 GiB) is the resident model, so the GPU is not oversubscribed (12.6 + 8 < 24). Had it
started while gemma (22.1 GiB) was resident, the GPU would be oversubscribed and gemma's runner would crash at its
next request (runtime out of memory) through kvgate too: kvgate gates loads, not models already resident, and an
over-committed GPU makes its loads wait rather than unload the idle model (``gateway.loads.plan.decide_load``).

Every phase switches models: ``model_switches`` counts 9 (the first load included), the most loads the workload can
need through kvgate (a switch needs one load at most; a refused one none).
"""

from __future__ import annotations

import random

from kvsim.config import SimConfig
from kvsim.gpu.vgpu import GIB
from kvsim.templates import Message
from kvsim.workload.workload import Call, GpuEvent, _conversation

MODELS = ("llama3.1:8b", "qwen2.5:32b", "gemma3:27b")
FOREIGN = GpuEvent("trainer", 8 * GIB)
ROUNDS = 3
PHASE = "models"


def multi_model_sim_config(*, time_scale: float = 4.0) -> SimConfig:
    """One 24 GiB GPU, OLLAMA_NUM_PARALLEL=2, the three models; keep_alive long enough that nothing expires on its
    own during the run (the loads and unloads counted are the workload's). llama.cpp's automatic fit is off
    (``llama_fit``, LLAMA_ARG_FIT): with it on, a load that does not fit runs partly offloaded to the CPU (slow, no
    failure) instead of answering out of memory, and the straight run shows no OOM at load."""
    return SimConfig(
        models=MODELS,
        llama_fit=False,
        num_parallel=2,
        load_s=2.0,
        time_scale=time_scale,
        prompt_tokens_per_s=5000.0,
        gen_tokens_per_s=60.0,
        min_response_tokens=16,
        max_response_tokens=32,
        keep_alive_s=3600.0,
    )


def multi_model_script(*, seed: int = 11) -> tuple[list[list[Call]], dict[int, tuple[GpuEvent, ...]]]:
    """(phases, GPU events by the index of the phase they come before): the foreign process starts after round 2's
    first phase and ends after round 3's."""
    rng = random.Random(seed)
    llama, qwen, gemma = MODELS
    phases: list[list[Call]] = []
    for n in range(ROUNDS):
        phases.append([Call("alice", PHASE, llama, _conversation(rng, 1 + n, 30, "And then?"), None)
                       for _ in range(2)])  # fmt: skip
        phases.append([
            Call("bob", PHASE, qwen, _conversation(rng, 2, 40, "Review this."), None),
            Call("bob", PHASE, qwen, _conversation(rng, 2, 40, "Summarize."), 16384),
        ])  # fmt: skip
        phases.append([Call("carol", PHASE, gemma, (Message("user", "Describe the picture in one line."),), None)])
    events: dict[int, tuple[GpuEvent, ...]] = {4: (FOREIGN,), 7: (GpuEvent(FOREIGN.name),)}
    return phases, events


def model_switches(phases: list[list[Call]]) -> int:
    """How many times the next phase needs a model other than the one before (the first phase counts): the most
    loads a workload of one-model phases needs."""
    switches, previous = 0, None
    for phase in phases:
        models = {call.model for call in phase}
        if models != previous:
            switches += len(models - (previous or set()))
        previous = models
    return switches
