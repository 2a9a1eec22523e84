"""The simulated day of bench/scale.py: its tenants, its curve, the requests it sends, and what came back."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson

MODEL = "llama3.1:8b"
CONTEXT_EXCEEDED = "Context size has been exceeded."
HOST_CONTEXTS = (16384,) * 4 + (8192,) * 4
SIM_DAY_S = 86_400.0
WINDOWS = 96  # 15 simulated minutes each
CONTENDED_QUEUED = 5  # queued requests that make a window contended
SHARE_TARGET = 0.90
SHARE_OF_SINGLE = 0.95
ADDED_MEDIAN_TARGET_S = 0.005
PROMPT_TOKENS_PER_S = 600.0
GEN_TOKENS_PER_S = 20.0
CONFIGS = ("shared", "independent", "single")
_WORD_TEXT = (
    "the a of to and in is it that for on with as was at by be this from or have an they which one you were all "
    "we when there can more if out so what up about into than them some could time only new would other how then "
    "its like our two first also after work way even back any most where these well because over just people those "
    "data model server memory cache token request queue answer report build test deploy review merge branch commit "
    "function class module error value result config table index query schema user team project plan week"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class Tenant:
    weight: float
    per_day: float  # requests in the day at scale 1.0 (before the curve's shape)
    stream: float  # fraction streamed


TENANTS: dict[str, Tenant] = {
    "chat": Tenant(2.0, 500, 0.85),
    "code": Tenant(2.0, 500, 1.0),
    "agents": Tenant(1.0, 150, 0.0),
    "batch": Tenant(1.0, 300, 0.0),
}
HOURLY = (0.02, 0.02, 0.02, 0.02, 0.02, 0.03, 0.05, 0.15, 0.45, 0.85, 1.0, 1.0,
          0.55, 0.8, 1.1, 1.15, 1.05, 0.75, 0.4, 0.2, 0.12, 0.08, 0.05, 0.03)
"""The interactive tenants' rate per hour of the day, relative to the busiest hours."""
BURSTS_H = ((10.5, 0.25), (14.5, 0.25), (16.25, 0.25))
"""(start hour, length in hours): the rate triples (a meeting ends, a demo, a release)."""
BATCH_H = (14.0, 15.5)


@dataclass(frozen=True)
class Scale:
    day_s: float  # real seconds the simulated day takes
    time_scale: float  # the simulators' simulated seconds per real second
    volume: float  # times TENANTS' per_day
    queue_timeout_s: float
    probes: int  # streamed requests sent one at a time after the day, for the added latency


FULL = Scale(day_s=180.0, time_scale=5.0, volume=1.0, queue_timeout_s=60.0, probes=200)
QUICK = Scale(day_s=5.0, time_scale=5.0, volume=0.1, queue_timeout_s=20.0, probes=30)


@dataclass(frozen=True)
class Planned:
    at_s: float  # real seconds from the start of the day
    tenant: str
    replica: int  # 0..2 (the single replica takes them all)
    messages: tuple[tuple[str, str], ...]
    max_tokens: int | None
    stream: bool

    def body(self) -> bytes:
        body: dict[str, Any] = {"model": MODEL, "stream": self.stream,
                                "messages": [{"role": role, "content": text} for role, text in self.messages]}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return orjson.dumps(body)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _rate(tenant: str, hour: float) -> float:
    """Relative request rate of ``tenant`` at ``hour`` (0..24)."""
    if tenant == "batch":
        return 1.0 if BATCH_H[0] <= hour < BATCH_H[1] else 0.0
    rate = HOURLY[int(hour) % 24]
    if any(start <= hour < start + length for start, length in BURSTS_H):
        rate *= 3.0
    return rate


def _arrivals(rng: random.Random, tenant: str, count: float) -> list[float]:
    """Arrival hours of ``tenant``'s requests: a Poisson process shaped by ``_rate`` (thinning), ``count`` expected."""
    steps = [(_rate(tenant, h / 60), h / 60) for h in range(24 * 60)]
    mass = sum(rate for rate, _ in steps) / 60
    peak = max(rate for rate, _ in steps)
    hours: list[float] = []
    hour = 0.0
    per_hour_peak = count / mass * peak
    while True:
        hour += rng.expovariate(per_hour_peak)
        if hour >= 24:
            return hours
        if rng.random() * peak < _rate(tenant, hour):
            hours.append(hour)


def _request(rng: random.Random, tenant: str) -> tuple[tuple[tuple[str, str], ...], int | None, bool]:
    stream = rng.random() < TENANTS[tenant].stream
    if tenant == "chat":
        turns = rng.choice((1, 1, 2, 3, 4, 6))
        long = rng.random() < 0.2
        messages: list[tuple[str, str]] = [("system", "You are the team's assistant. " + _text(rng, 40))]
        for _ in range(turns - 1):
            messages += [("user", _text(rng, rng.randint(60, 900 if long else 250))),
                         ("assistant", _text(rng, rng.randint(60, 500 if long else 200)))]
        messages.append(("user", _text(rng, rng.randint(20, 400))))
        return tuple(messages), rng.choice((None, None, 512, 1024)), stream
    if tenant == "code":
        return (("system", "Complete the code."), ("user", _text(rng, rng.randint(100, 900)))), \
            rng.choice((64, 128, 256)), stream
    if tenant == "agents":
        return (("system", "You may call tools. " + _text(rng, 200)),
                ("user", _text(rng, rng.randint(1600, 5000)))), 512, stream
    return (("user", "Summarize: " + _text(rng, rng.randint(600, 900))),), 256, stream


def workload(seed: int, scale: Scale) -> list[Planned]:
    """The day's requests, in order of arrival; the same for a seed and scale."""
    rng = random.Random(seed)
    planned = []
    for tenant, profile in TENANTS.items():
        for hour in _arrivals(rng, tenant, profile.per_day * scale.volume):
            messages, max_tokens, stream = _request(rng, tenant)
            planned.append(Planned(hour / 24 * scale.day_s, tenant, rng.randrange(3), messages, max_tokens, stream))
    return sorted(planned, key=lambda p: p.at_s)


def key_of(tenant: str) -> str:
    return f"scale-{tenant}-key"



# --- one configuration ----------------------------------------------------------------------------------------------


@dataclass
class Answer:
    planned: Planned
    status: int = 0
    code: str = ""  # kvgate's error code (or the backend's error type)
    out_of_memory: bool = False
    wait_s: float | None = None  # X-Kvgate-Queue-Wait; None: not admitted
    reserved_tokens: int = 0
    ttfb_s: float = 0.0  # to the response headers
    sim_first_token_s: float | None = None  # the simulator's own prompt + first token, real seconds
    backend: str = ""

    @property
    def added_s(self) -> float | None:
        """kvgate's added latency, for a streamed request admitted without waiting."""
        if not self.planned.stream or self.status != 200 or self.wait_s != 0 or self.sim_first_token_s is None:
            return None
        return self.ttfb_s - self.sim_first_token_s


@dataclass
class Run:
    config: str
    scale: Scale
    answers: list[Answer] = field(default_factory=list)
    wall_s: float = 0.0
    lost_races: int = 0
    turns_kept: int = 0
    elastic_steps: int = 0  # growth steps of elastic reservations (through Redis when shared)
    elastic_ends: int = 0  # replies kvgate ended for want of room to grow
    lag_ms: list[float] = field(default_factory=list)
    probes: list[Answer] = field(default_factory=list)
