"""Counters and a short event log, served at ``GET /sim/stats`` so a workload can count reloads and OOMs."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SimStats:
    loads: int = 0  # every model load, reloads included
    reloads: int = 0  # loads that replaced a runner of the same model whose options no longer matched
    evictions: int = 0  # runners unloaded to make room for another model
    unloads: int = 0  # runners unloaded for any reason
    load_failures: int = 0  # loads refused for lack of GPU memory
    partial_offloads: int = 0  # loads that llama.cpp's fit left partly on the CPU (E3, first model)
    runtime_ooms: int = 0  # runners that crashed mid-generation (GPU oversubscribed)
    requests: int = 0
    completed: int = 0
    failed: int = 0
    truncated_prompts: int = 0  # prompts cut silently (messages dropped or tokens discarded)
    context_exceeded: int = 0  # llama-server mode: requests failed by "Context size has been exceeded."
    waiting: int = 0  # requests waiting for a slot right now
    max_waiting: int = 0
    queued: int = 0  # requests in Ollama's pending queue right now (OLLAMA_MAX_QUEUE bounds it)
    scheduling: int = 0  # requests the scheduler has taken from that queue and is placing (waiting for memory)
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=256))

    def event(self, t_s: float, kind: str, **detail: Any) -> None:
        self.events.append({"t_s": round(t_s, 3), "event": kind, **detail})

    def wait_started(self) -> None:
        self.waiting += 1
        self.max_waiting = max(self.max_waiting, self.waiting)

    def wait_ended(self) -> None:
        self.waiting -= 1

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["events"] = list(self.events)
        return data
