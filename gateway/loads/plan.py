"""Load admission and residency: whether a model may load on a GPU now, at what context, after which unloads (pure).

Theory of operation
-------------------
A request for an Ollama model that is not resident (or resident at another context) makes Ollama load it. Before
kvgate lets that happen it asks ``decide_load`` with the backend's ``GpuBudget`` (live reading, resident models,
loads in flight) and what it knows of each resident model: kvgate's own active sequences on it, when it was last
used and loaded, and its per-model pin and priority. The answer, in order of least harm:

    LOAD     at the context asked for, when it fits free VRAM (minus ``headroom_bytes``) plus what unloading idle
             models gives back; ``unload`` names them, least valuable first
    LOAD     at a lowered context: the largest (a multiple of 256, never below ``floor_context_tokens``) that fits
             after unloading every idle model it must; ``lowered_from`` says so
    WAIT     when it does not fit yet but will once something ends: models kvgate has active sequences on, models
             loaded less than ``min_resident_s`` ago (hysteresis: two models taking turns swap at most once per
             interval), or a GPU reading that shows more committed than the GPU has (a foreign process took memory)
    REFUSE   when nothing that ends would make room: the numbers say what it needs and what is free

An unload candidate is a resident model other than the one asked for that is idle (no active sequence through
kvgate, and not just loaded for requests still on their way to it), not pinned, of a priority no higher than the
asking model's, and resident for at least ``min_resident_s``; candidates go lowest priority first, then least
recently used. ``max_loaded_models`` (Ollama's ``OLLAMA_MAX_LOADED_MODELS``) forces unloads even when the bytes fit.

Pure: no I/O, no clock (the caller passes ``now_s``), no logging.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gateway.loads.gpu_ledger import FitVerdict, plan_load

CONTEXT_STEP_TOKENS = 256
"""Contexts are lowered in steps of this (Ollama rounds num_ctx to a multiple of 256 per sequence anyway)."""


@dataclass(frozen=True, slots=True)
class ResidentState:
    """One model resident on the GPU, with what kvgate knows of its use."""

    name: str
    resident_bytes: int
    active_sequences: int = 0
    pinned: bool = False
    priority: int = 0
    last_used_s: float = float("-inf")
    loaded_at_s: float = float("-inf")
    """When kvgate saw it load; -inf for a model loaded before kvgate looked (not protected by hysteresis)."""
    awaited: bool = False
    """Loaded for requests that have not been admitted on it yet: not unloaded from under them."""


@dataclass(frozen=True, slots=True)
class LoadAsk:
    """A load kvgate is asked to let happen: ``load_bytes_at(context)`` is the load's cost at a context (monotone)."""

    model: str
    context_tokens: int
    floor_context_tokens: int
    load_bytes_at: Callable[[int], int]
    priority: int = 0


@dataclass(frozen=True, slots=True)
class GpuRoom:
    """The budget's numbers a decision needs: ``available_bytes`` (total - resident - other - reserved, negative
    when over-committed) and the GPU's ``total_bytes``."""

    available_bytes: int
    total_bytes: int
    headroom_bytes: int = 0
    max_loaded_models: int | None = None


class LoadAction(StrEnum):
    LOAD = "load"
    WAIT = "wait"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class LoadDecision:
    action: LoadAction
    model: str
    context_tokens: int
    """The context to load with (LOAD), or the one asked for."""
    load_bytes: int
    free_bytes: int
    """What the GPU has free now, minus the headroom (can be negative when over-committed)."""
    unload: tuple[str, ...] = ()
    freed_bytes: int = 0
    lowered_from: int | None = None
    reason: str = ""
    offloaded_ram_bytes: int = 0
    """System RAM the layers that stay on the CPU take (a load allowed to spill, ``residency.when_gpu_full``)."""
    cpu_layers: int = 0
    n_layers: int = 0
    """Of a load allowed to spill: the layers that stay on the CPU, of the model's."""

    def describe(self) -> str:
        """One line for the log, a header or an error message."""
        gib = 2**30
        head = f"model {self.model!r}: {self.load_bytes / gib:.2f} GiB at a context of {self.context_tokens} tokens"
        room = f"{max(0, self.free_bytes) / gib:.2f} GiB free"
        if self.action is LoadAction.LOAD:
            parts = [f"{head} fits ({room})"]
            if self.unload:
                parts.append(f"after unloading {', '.join(self.unload)} ({self.freed_bytes / gib:.2f} GiB)")
            if self.lowered_from is not None:
                parts.append(f"context lowered from {self.lowered_from} tokens to fit GPU memory")
            if self.offloaded_ram_bytes:
                parts[0] = f"{head} loads partly on the CPU ({room})"
                parts.append(f"{self.reason}")
            return "; ".join(parts)
        return f"{head} needs more than the GPU has ({room}): {self.reason}"


def unload_candidates(
    residents: Sequence[ResidentState], ask: LoadAsk, now_s: float, min_resident_s: float
) -> tuple[list[ResidentState], list[ResidentState]]:
    """(models that may be unloaded now, in order; models that may be once they are idle or old enough)."""
    now_free: list[ResidentState] = []
    later: list[ResidentState] = []
    for model in residents:
        if model.name == ask.model or model.pinned or model.priority > ask.priority:
            continue
        if model.active_sequences > 0 or model.awaited or now_s - model.loaded_at_s < min_resident_s:
            later.append(model)
        else:
            now_free.append(model)
    now_free.sort(key=lambda m: (m.priority, m.last_used_s, m.name))
    return now_free, later


def decide_load(
    ask: LoadAsk, room: GpuRoom, residents: Sequence[ResidentState], *, now_s: float, min_resident_s: float,
    own_resident_bytes: int = 0,
) -> LoadDecision:
    """The decision for ``ask`` (see the module docstring). ``own_resident_bytes``: what the model holds now when
    this is a reload at another context (freed by the reload itself)."""
    # the lowest context a lowering can reach: the floor rounded up to the step grid, at most the context asked for
    floor = min(ask.context_tokens, max(CONTEXT_STEP_TOKENS, -(-ask.floor_context_tokens // CONTEXT_STEP_TOKENS)
                                        * CONTEXT_STEP_TOKENS))
    if floor != ask.floor_context_tokens:
        ask = LoadAsk(ask.model, ask.context_tokens, floor, ask.load_bytes_at, ask.priority)
    available = room.available_bytes + own_resident_bytes
    free = room.available_bytes - room.headroom_bytes
    now_free, later = unload_candidates(residents, ask, now_s, min_resident_s)
    others = [m for m in residents if m.name != ask.model]
    must_unload = 0
    if room.max_loaded_models is not None:
        must_unload = max(0, len(others) + 1 - room.max_loaded_models)

    def attempt(context: int, candidates: Sequence[ResidentState]) -> LoadDecision | None:
        load_bytes = ask.load_bytes_at(context)
        forced = list(candidates[:must_unload])
        if len(forced) < must_unload:
            return None
        rest = [(m.name, m.resident_bytes) for m in candidates[must_unload:]]
        forced_bytes = sum(m.resident_bytes for m in forced)
        fit = plan_load(available + forced_bytes, load_bytes, rest, room.headroom_bytes, cap_bytes=room.total_bytes)
        if fit.verdict is FitVerdict.DOES_NOT_FIT:
            return None
        unload = (*(m.name for m in forced), *fit.unload)
        return LoadDecision(LoadAction.LOAD, ask.model, context, load_bytes, free, unload,
                            forced_bytes + fit.freed_bytes)

    if room.available_bytes < 0:
        overcommitted = -room.available_bytes
        return LoadDecision(
            LoadAction.WAIT, ask.model, ask.context_tokens, ask.load_bytes_at(ask.context_tokens), free,
            reason=f"the GPU is over-committed by {overcommitted / 2**30:.2f} GiB (another process took memory the "
            "resident models need); loads wait until it is not")
    decided = attempt(ask.context_tokens, now_free)
    if decided is not None:
        return decided
    lowered = _largest_context(ask, lambda context: attempt(context, now_free) is not None)
    if lowered is not None:
        decided = attempt(lowered, now_free)
        assert decided is not None
        return LoadDecision(decided.action, decided.model, decided.context_tokens, decided.load_bytes, free,
                            decided.unload, decided.freed_bytes, lowered_from=ask.context_tokens)
    load_bytes = ask.load_bytes_at(ask.floor_context_tokens)
    if later and attempt(ask.floor_context_tokens, [*now_free, *later]) is not None:
        busy = ", ".join(m.name for m in later)
        return LoadDecision(LoadAction.WAIT, ask.model, ask.context_tokens, ask.load_bytes_at(ask.context_tokens),
                            free, reason=f"it fits once {busy} can be unloaded (in use, or loaded moments ago)")
    if must_unload and len(now_free) + len(later) < must_unload:
        reason = (f"{len(others)} models are loaded, the most the backend keeps is {room.max_loaded_models}, and "
                  "none of them may be unloaded (pinned, or of a higher priority)")
    else:
        freeable = sum(m.resident_bytes for m in [*now_free, *later])
        most = max(0, min(available + freeable, room.total_bytes) - room.headroom_bytes)
        reason = (f"even at the floor context of {ask.floor_context_tokens} tokens it needs "
                  f"{load_bytes / 2**30:.2f} GiB and at most {most / 2**30:.2f} GiB can be had by unloading the "
                  "models that may be unloaded")
    return LoadDecision(LoadAction.REFUSE, ask.model, ask.context_tokens, ask.load_bytes_at(ask.context_tokens),
                        free, reason=reason)


def _largest_context(ask: LoadAsk, fits: Callable[[int], bool]) -> int | None:
    """The largest context in [floor, asked) on the step grid that ``fits`` (monotone), None when none does."""
    lo = max(CONTEXT_STEP_TOKENS, -(-ask.floor_context_tokens // CONTEXT_STEP_TOKENS) * CONTEXT_STEP_TOKENS)
    hi = ((ask.context_tokens - 1) // CONTEXT_STEP_TOKENS) * CONTEXT_STEP_TOKENS
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + CONTEXT_STEP_TOKENS) // (2 * CONTEXT_STEP_TOKENS) * CONTEXT_STEP_TOKENS
        mid = max(mid, lo + CONTEXT_STEP_TOKENS)
        if fits(mid):
            lo = mid
        else:
            hi = mid - CONTEXT_STEP_TOKENS
    return lo
