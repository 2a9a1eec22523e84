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
no ``X-Kvgate-*`` response header announcing it; with one it is ``trimmed``);
``failed_oom`` / ``failed_500`` / ``failed_4xx``; ``timed_out``. Model reloads come from the simulator's
``GET /sim/stats``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
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


@dataclass
class RunReport:
    name: str
    outcomes: list[Outcome]
    reloads: int
    wall_s: float

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)


Progress = Callable[[int, int, Outcome], None]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)) + "."


def _conversation(rng: random.Random, turns: int, words_per_turn: int, question: str) -> tuple[Message, ...]:
    msgs = [Message("system", "You are a helpful assistant.")]
    for _ in range(turns):
        msgs += [Message("user", _text(rng, words_per_turn)), Message("assistant", _text(rng, words_per_turn))]
    return (*msgs, Message("user", question))


def demo_sim_config() -> SimConfig:
    """The simulator the demo runs against: one 24 GiB GPU, OLLAMA_NUM_PARALLEL=2, 4x simulated time."""
    return SimConfig(
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
                       progress: Progress | None = None) -> RunReport:  # fmt: skip
    """Send the script to ``base_url``; ``sim_url`` (default ``base_url``) answers ``GET /sim/stats``."""
    phases = script if script is not None else demo_script()
    total = sum(len(p) for p in phases)
    outcomes: list[Outcome] = []
    start = time.monotonic()
    async with aiohttp.ClientSession(base_url.rstrip("/")) as session:
        reloads_before = await _reloads(session, sim_url)
        for phase in phases:
            results = await asyncio.gather(*(_send(session, call, timeout_s) for call in phase))
            for outcome in results:
                outcomes.append(outcome)
                if progress is not None:
                    progress(len(outcomes), total, outcome)
        reloads = await _reloads(session, sim_url) - reloads_before
    return RunReport(name=name, outcomes=outcomes, reloads=reloads, wall_s=time.monotonic() - start)


async def _reloads(session: aiohttp.ClientSession, sim_url: str | None) -> int:
    url = (sim_url.rstrip("/") if sim_url else "") + "/sim/stats"
    async with session.get(url) as resp:
        body = await resp.json()
    return int(body["reloads"])


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
