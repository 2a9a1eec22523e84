"""The net-effect benchmark's workloads: what the clients of one cell send, and how (all of it deterministic).

    Chats    ``clients`` conversations at once, each ``turns`` turns in a row: every turn resends the whole history
             with the previous answers, as chat clients do (Open WebUI, Continue, aider, the SDKs' chat loops)
    Burst    ``requests`` sent at once (new conversations, batches, embeddings)
    Phases   bursts one after another (a phase starts when the previous one has ended)

Sent straight at the backends, conversation or request ``i`` goes to backend ``i % n``: what a team without kvgate
does with several hosts (nginx's round robin, or clients split by hand). Through kvgate, everything goes to kvgate.

``Foreign`` is a process taking GPU memory on the simulated GPU behind the server's back (``/sim/processes``):
before the run, ``at_s`` seconds into it, or before a phase of a ``Phases`` workload.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.net_effect_client import Request, Result, send

_WORD_TEXT = (
    "the model cache answer request memory context window server token story river city garden question reason "
    "result method sample signal energy paper morning evening light water music house simple value layer number "
    "table stone cloud green market forest ocean summer silver letter friend travel history science nature"
)
_WORDS = tuple(_WORD_TEXT.split())
TIMEOUT_S = 120.0
"""A client's patience for one whole answer (bounded: a stuck request is counted as timed out, not waited for)."""
PhaseHook = Callable[[int], Awaitable[None]]


def words(rng: random.Random, count: int) -> str:
    """``count`` common English words: about one Llama-3 token each."""
    return " ".join(rng.choice(_WORDS) for _ in range(count)) + "."


def openai_chat(model: str | None, messages: list[dict[str, Any]], *, stream: bool, **extra: Any) -> Request:
    body: dict[str, Any] = {"messages": messages, "stream": stream, **extra}
    if model is not None:
        body["model"] = model
    if stream:
        body["stream_options"] = {"include_usage": True}
    return Request("/v1/chat/completions", body, "openai", stream)


@dataclass(frozen=True)
class Chats:
    """``clients`` conversations at once of ``turns`` turns each, on ``route`` (``ollama``: /api/chat, ``openai``:
    /v1/chat/completions); odd clients stream (chat UIs do; SDK scripts mostly don't)."""

    clients: int
    turns: int
    model: str | None
    route: str = "ollama"
    first_words: int = 60
    turn_words: int = 40
    extra: tuple[tuple[str, Any], ...] = ()
    """Fields the requests carry (an OpenAI body's ``max_tokens``, an Ollama body's ``options``)."""
    extra_for: tuple[int, ...] = ()
    """The clients whose requests carry ``extra`` (empty: every client)."""
    seed: int = 1

    @property
    def requests(self) -> int:
        return self.clients * self.turns

    async def run(self, http: aiohttp.ClientSession, bases: Sequence[str], on_phase: PhaseHook) -> list[Result]:
        await on_phase(0)
        runs = [self._client(http, bases[c % len(bases)], c) for c in range(self.clients)]
        return [result for results in await asyncio.gather(*runs) for result in results]

    async def _client(self, http: aiohttp.ClientSession, base: str, client: int) -> list[Result]:
        rng = random.Random(self.seed * 1000 + client)
        history: list[dict[str, Any]] = [
            {"role": "system", "content": f"You are assistant number {client}. Answer briefly."},
            {"role": "user", "content": words(rng, self.first_words)},
        ]
        results = []
        for _ in range(self.turns):
            request = self._request(history, stream=client % 2 == 1,
                                    extra=not self.extra_for or client in self.extra_for)
            result = await send(http, base, request, TIMEOUT_S)
            results.append(result)
            history += [{"role": "assistant", "content": result.text or "(no answer)"},
                        {"role": "user", "content": words(rng, self.turn_words)}]
        return results

    def _request(self, history: list[dict[str, Any]], *, stream: bool, extra: bool) -> Request:
        fields = dict(self.extra) if extra else {}
        if self.route == "ollama":
            assert self.model is not None
            body: dict[str, Any] = {"model": self.model, "messages": list(history), "stream": stream, **fields}
            return Request("/api/chat", body, "ollama", stream)
        return openai_chat(self.model, list(history), stream=stream, **fields)


@dataclass(frozen=True)
class Burst:
    """Requests sent at once; request ``i`` goes to backend ``i % n`` when sent straight."""

    batch: tuple[Request, ...]

    @property
    def requests(self) -> int:
        return len(self.batch)

    async def run(self, http: aiohttp.ClientSession, bases: Sequence[str], on_phase: PhaseHook) -> list[Result]:
        await on_phase(0)
        return await self.send_all(http, bases)

    async def send_all(self, http: aiohttp.ClientSession, bases: Sequence[str]) -> list[Result]:
        return list(await asyncio.gather(*(send(http, bases[i % len(bases)], request, TIMEOUT_S)
                                           for i, request in enumerate(self.batch))))


@dataclass(frozen=True)
class Phases:
    """Bursts one after another."""

    phases: tuple[Burst, ...]

    @property
    def requests(self) -> int:
        return sum(phase.requests for phase in self.phases)

    async def run(self, http: aiohttp.ClientSession, bases: Sequence[str], on_phase: PhaseHook) -> list[Result]:
        results: list[Result] = []
        for index, phase in enumerate(self.phases):
            await on_phase(index)
            results += await phase.send_all(http, bases)
        return results


Workload = Chats | Burst | Phases


@dataclass(frozen=True)
class Foreign:
    """A foreign process of ``nbytes`` on the simulated GPU of backend ``host``: from ``at_s`` seconds into the run
    (0: before it starts) or from the start of phase ``phase``, until ``ends_s`` seconds in, or the start of phase
    ``ends_phase`` (neither: the end of the run)."""

    nbytes: int
    at_s: float = 0.0
    phase: int | None = None
    ends_s: float | None = None
    ends_phase: int | None = None
    host: int = 0
    name: str = "foreign-job"


@dataclass
class ForeignProcesses:
    """Applies ``Foreign`` events to the simulators, at their times or phases; ``stop`` ends what still runs."""

    http: aiohttp.ClientSession
    sims: Sequence[str]
    events: Sequence[Foreign]
    _pids: dict[int, tuple[str, int]] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def before(self) -> None:
        for index, event in enumerate(self.events):
            if event.phase is None and event.at_s <= 0:
                await self._start(index, event)

    def during(self) -> None:
        for index, event in enumerate(self.events):
            if event.phase is None and (event.at_s > 0 or event.ends_s is not None):
                self._tasks.append(asyncio.ensure_future(self._timed(index, event)))

    async def on_phase(self, phase: int) -> None:
        for index, event in enumerate(self.events):
            if event.ends_phase == phase:
                await self._end(index)
            if event.phase == phase:
                await self._start(index, event)

    async def _timed(self, index: int, event: Foreign) -> None:
        if event.at_s > 0:
            await asyncio.sleep(event.at_s)
            await self._start(index, event)
        if event.ends_s is not None:
            await asyncio.sleep(max(0.0, event.ends_s - event.at_s))
            await self._end(index)

    async def _start(self, index: int, event: Foreign) -> None:
        sim = self.sims[event.host]
        async with self.http.post(f"{sim}/sim/processes", json={"name": event.name, "bytes": event.nbytes}) as reply:
            reply.raise_for_status()
            self._pids[index] = (sim, int((await reply.json())["pid"]))

    async def _end(self, index: int) -> None:
        found = self._pids.pop(index, None)
        if found is not None:
            async with self.http.delete(f"{found[0]}/sim/processes/{found[1]}") as reply:
                reply.raise_for_status()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for index in list(self._pids):
            await self._end(index)
