"""The scripted multi-user demo: what a shared Ollama goes through, against any base URL (the simulator directly,
or kvgate in front of it), with every request's outcome recorded.

Phases (all requests deterministic; a phase starts when the previous one has finished)::

    warm-up   alice: two short chats (num_ctx 8192)
    mixed     at once: alice short turns (8192), bob a long chat on a small num_ctx (4096, silently truncated by
              Ollama), carol a medium chat asking for 16384, dave through /v1 (no num_ctx at all), erin a second
              model: the clients' different num_ctx make Ollama reload the model back and forth
    burst     long conversations at once on a 32768 context (those beyond num_parallel queue without bound),
              mixed with clients asking for the model's full 131072: each of those forces a reload (after the
              in-flight requests finish) that does not fit the GPU (out of memory), then the next request reloads
              the 32768 runner again

Outcomes: ``completed``; ``truncated`` (200, but ``prompt_eval_count`` below the prompt's known token count, and
no ``X-Kvgate-*`` response header announcing it; with one it is ``trimmed``); ``refused`` (503 with Retry-After:
"not now, try again", e.g. kvgate's ``gpu_memory_exhausted``); ``failed_oom`` / ``failed_500`` / ``failed_4xx``;
``timed_out``. Model loads, reloads, unloads and failed loads come from the simulator's ``GET /sim/stats``.

Other scripts (``multi_model``) add ``GpuEvent``s between phases: a foreign process takes GPU memory behind the
server's back, or ends.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from kvsim.catalog import CATALOG
from kvsim.config import SimConfig
from kvsim.templates import Message, render
from kvsim.vocab import tokenizer_for

Api = Literal["ollama", "openai"]
OOM_MARKERS = ("out of memory", "out-of-memory", "cudaMalloc failed")
_WORD_TEXT = (
    "the model cache answer request memory context window server token story river city garden question reason "
    "result method sample signal energy paper morning evening light water music house simple value layer number"
)
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class Call:
    user: str
    phase: str
    model: str
    messages: tuple[Message, ...]
    num_ctx: int | None
    api: Api = "ollama"
    max_tokens: int = 48


@dataclass
class Outcome:
    call: Call
    status: str = "completed"
    http_status: int = 0
    error: str = ""
    latency_s: float = 0.0
    prompt_tokens_known: int = 0
    prompt_tokens_reported: int = 0
    generated_tokens: int = 0
    gateway_headers: dict[str, str] = field(default_factory=dict)
    retry_after: str = ""


@dataclass(frozen=True)
class GpuEvent:
    """Before a phase, on the simulated GPU: a foreign process ``name`` takes ``nbytes`` (``POST /sim/processes``),
    or, with ``nbytes`` 0, the one of that name ends (``DELETE /sim/processes/{pid}``)."""

    name: str
    nbytes: int = 0


@dataclass
class RunReport:
    name: str
    outcomes: list[Outcome]
    reloads: int
    wall_s: float
    loads: int = 0
    """Model loads the simulator made (reloads included), from ``/sim/stats``; likewise the next three."""
    unloads: int = 0
    load_failures: int = 0
    """Loads that did not fit the GPU (each an out-of-memory at load; Ollama may retry at a lower context)."""
    runtime_ooms: int = 0
    """Runners that crashed mid-generation (the GPU oversubscribed)."""
    gateway_loads: int | None = None
    """Loads and unloads the gateway in front made itself (None: nothing in front, or it does not say)."""
    gateway_unloads: int | None = None

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)


GatewayCounts = Callable[[], tuple[int, int]]
"""The gateway's own (loads, unloads) so far."""


Progress = Callable[[int, int, Outcome], None]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)) + "."


def _conversation(rng: random.Random, turns: int, words_per_turn: int, question: str) -> tuple[Message, ...]:
    msgs = [Message("system", "You are a helpful assistant.")]
    for _ in range(turns):
        msgs += [Message("user", _text(rng, words_per_turn)), Message("assistant", _text(rng, words_per_turn))]
    return (*msgs, Message("user", question))


def demo_sim_config() -> SimConfig:
    """The simulator the demo runs against: one 24 GiB GPU, OLLAMA_NUM_PARALLEL=2, 4x simulated time, and llama.cpp's
    automatic fit off (``LLAMA_ARG_FIT=off``, as before Ollama's E3 engine): a load too big for the GPU fails with
    Ollama's out-of-memory error rather than running partly, and slowly, on the CPU."""
    return SimConfig(
        llama_fit=False,
        models=("llama3.1:8b", "qwen2.5:7b"),
        num_parallel=2,
        load_s=3.0,
        time_scale=4.0,
        prompt_tokens_per_s=5000.0,
        gen_tokens_per_s=60.0,
        min_response_tokens=24,
        max_response_tokens=64,
    )


def demo_script(model: str = "llama3.1:8b", second_model: str = "qwen2.5:7b", *, seed: int = 7,
                burst: int = 6, greedy: int = 2) -> list[list[Call]]:  # fmt: skip
    """The phases of the demo; each phase is a list of calls sent concurrently."""
    rng = random.Random(seed)
    short = (Message("user", "Say hello in one short sentence."),)
    warm = [Call("alice", "warm-up", model, short, 8192) for _ in range(2)]
    mixed: list[Call] = []
    for turn in range(3):
        mixed.append(Call("alice", "mixed", model, _conversation(rng, turn, 30, "And then?"), 8192))
        mixed.append(Call("carol", "mixed", model, _conversation(rng, 4 + turn, 120, "Summarize."), 16384))
    mixed += [Call("bob", "mixed", model, _conversation(rng, 12, 260, "What did I say first?"), 4096) for _ in range(2)]
    mixed += [Call("dave", "mixed", model, _conversation(rng, 2, 40, "Continue."), None, "openai") for _ in range(2)]
    mixed += [Call("erin", "mixed", second_model, short, 8192)]
    burst_calls = [
        Call(f"long-{i}", "burst", model, _conversation(rng, 16, 220, "Give me the gist."), 32768) for i in range(burst)
    ]
    for i in range(greedy):
        position = (i + 1) * len(burst_calls) // (greedy + 1)
        burst_calls.insert(position, Call(f"max-{i}", "burst", model, _conversation(rng, 2, 50, "Go on."), 131072))
    return [warm, mixed, burst_calls]


def known_prompt_tokens(call: Call) -> int:
    """The prompt's token count as the model renders and tokenizes it (no truncation)."""
    spec = CATALOG[call.model]
    return len(tokenizer_for(spec).encode(render(spec.template, call.messages)))


async def run_workload(base_url: str, *, name: str, sim_url: str | None = None,
                       script: list[list[Call]] | None = None, timeout_s: float = 20.0,
                       progress: Progress | None = None, gpu_events: Mapping[int, Sequence[GpuEvent]] | None = None,
                       gateway_counts: GatewayCounts | None = None) -> RunReport:  # fmt: skip
    """Send the script to ``base_url``; ``sim_url`` (default ``base_url``) answers ``GET /sim/stats`` and takes the
    ``gpu_events`` (by the index of the phase they come before); ``gateway_counts`` reads the gateway's own loads
    and unloads."""
    phases = script if script is not None else demo_script()
    total = sum(len(p) for p in phases)
    outcomes: list[Outcome] = []
    sim = sim_url.rstrip("/") if sim_url else ""
    pids: dict[str, int] = {}
    start = time.monotonic()
    async with aiohttp.ClientSession(base_url.rstrip("/")) as session:
        before = await _sim_counts(session, sim)
        gateway_before = gateway_counts() if gateway_counts is not None else (0, 0)
        for index, phase in enumerate(phases):
            for event in (gpu_events or {}).get(index, ()):
                await _apply(session, sim, event, pids)
            results = await asyncio.gather(*(_send(session, call, timeout_s) for call in phase))
            for outcome in results:
                outcomes.append(outcome)
                if progress is not None:
                    progress(len(outcomes), total, outcome)
        for leftover in list(pids):  # a foreign process the script left running ends with the run
            await _apply(session, sim, GpuEvent(leftover), pids)
        after = await _sim_counts(session, sim)
        gateway_after = gateway_counts() if gateway_counts is not None else None
    delta = {key: after[key] - before[key] for key in after}
    return RunReport(
        name=name, outcomes=outcomes, reloads=delta["reloads"], wall_s=time.monotonic() - start,
        loads=delta["loads"], unloads=delta["unloads"], load_failures=delta["load_failures"],
        runtime_ooms=delta["runtime_ooms"],
        gateway_loads=None if gateway_after is None else gateway_after[0] - gateway_before[0],
        gateway_unloads=None if gateway_after is None else gateway_after[1] - gateway_before[1],
    )


_SIM_COUNTERS = ("loads", "reloads", "unloads", "load_failures", "runtime_ooms")


async def _sim_counts(session: aiohttp.ClientSession, sim: str) -> dict[str, int]:
    async with session.get(sim + "/sim/stats") as resp:
        body = await resp.json()
    return {key: int(body[key]) for key in _SIM_COUNTERS}


async def _apply(session: aiohttp.ClientSession, sim: str, event: GpuEvent, pids: dict[str, int]) -> None:
    if event.nbytes > 0:
        async with session.post(sim + "/sim/processes", json={"name": event.name, "bytes": event.nbytes}) as resp:
            resp.raise_for_status()
            pids[event.name] = int((await resp.json())["pid"])
        return
    pid = pids.pop(event.name, None)
    if pid is None:
        raise ValueError(f"no foreign process {event.name!r} to end")
    async with session.delete(f"{sim}/sim/processes/{pid}") as resp:
        resp.raise_for_status()


def _body(call: Call) -> tuple[str, dict[str, Any]]:
    messages = [{"role": m.role, "content": m.content} for m in call.messages]
    if call.api == "openai":
        return "/v1/chat/completions", {"model": call.model, "messages": messages, "max_tokens": call.max_tokens}
    options: dict[str, Any] = {"num_predict": call.max_tokens}
    if call.num_ctx is not None:
        options["num_ctx"] = call.num_ctx
    return "/api/chat", {"model": call.model, "messages": messages, "stream": False, "options": options}


async def _send(session: aiohttp.ClientSession, call: Call, timeout_s: float) -> Outcome:
    out = Outcome(call=call, prompt_tokens_known=known_prompt_tokens(call))
    path, body = _body(call)
    start = time.monotonic()
    try:
        async with session.post(path, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            out.http_status = resp.status
            out.gateway_headers = {k: v for k, v in resp.headers.items() if k.lower().startswith("x-kvgate")}
            out.retry_after = resp.headers.get("Retry-After", "")
            payload = await resp.json(content_type=None)
    except TimeoutError:
        out.status, out.error = "timed_out", f"no answer within {timeout_s:g} s"
        out.latency_s = time.monotonic() - start
        return out
    out.latency_s = time.monotonic() - start
    _classify(out, payload)
    return out


def _classify(out: Outcome, payload: Any) -> None:
    if out.http_status != 200 or not isinstance(payload, dict) or "error" in payload:
        err = payload.get("error") if isinstance(payload, dict) else payload
        message = err.get("message", "") if isinstance(err, dict) else str(err)
        out.error = message
        if any(marker in message for marker in OOM_MARKERS):
            out.status = "failed_oom"
        elif out.http_status == 503 and out.retry_after:
            out.status = "refused"  # "not now": nothing ran, the client is told when to try again
        else:
            out.status = "failed_4xx" if 400 <= out.http_status < 500 else "failed_500"
        return
    if "usage" in payload:
        out.prompt_tokens_reported = int(payload["usage"]["prompt_tokens"])
        out.generated_tokens = int(payload["usage"]["completion_tokens"])
    else:
        out.prompt_tokens_reported = int(payload.get("prompt_eval_count", 0))
        out.generated_tokens = int(payload.get("eval_count", 0))
    if out.prompt_tokens_reported < out.prompt_tokens_known:
        # smaller than the prompt: announced by a gateway header, or silent (Ollama's own truncation)
        out.status = "trimmed" if out.gateway_headers else "truncated"
