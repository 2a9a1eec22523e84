"""Which backend a request goes to, when several serve its model: a pure ranking of what each one looks like now.

Theory of operation
-------------------
The router (router.py) builds one ``CandidateView`` per backend that serves the model, from the pool directory,
the ledger, the waiting room and the outage book; ``rank`` orders them, best first, and says why. The request goes
to the first; if that one fails before anything reached the client, to the next, and so on.

    healthy before out       a backend taken out after a failure (outages.py) is used only if nothing else is left
    1 room now               model resident, a free slot and (unified pool) the request's tokens free:
                             most free KV first, then the shortest queue
    2 room unknown           resident, its pool not probed yet (a llama-server nobody sent to): shortest queue
    3 full                   resident, the request would wait in kvgate's queue: shortest queue, then most free KV
    4 load, no eviction      an Ollama model not resident that fits the GPU's free memory as it is
    5 load with eviction     ... after unloading idle models: fewest bytes evicted first, then fewest models
    6 load, cost unknown     no GPU reading to plan the load with
    7 cannot load            the GPU can't hold it now (the load would wait or be refused)

Ties keep the order of the configuration (``[[backends]]``). A conversation's ``sticky`` backend (the one that holds
its prompt cache) goes first while it fits: when it is healthy and its class is as good as the best one's (a sticky
backend with room now beats another with more free KV; a full one does not beat one with room).

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum


class Standing(IntEnum):
    """How soon a request would run on a backend (lower is sooner); the classes of the module docstring."""

    ROOM_NOW = 1
    ROOM_UNKNOWN = 2
    FULL = 3
    LOAD_FITS = 4
    LOAD_EVICTS = 5
    LOAD_UNKNOWN = 6
    CANNOT_LOAD = 7


@dataclass(frozen=True, slots=True)
class LoadCost:
    """What loading the model on a backend where it is not resident would take: nothing to unload (``evict_bytes``
    0), idle models to unload, or no load possible now (``possible`` False)."""

    possible: bool = True
    evict_bytes: int = 0
    evict_models: int = 0


@dataclass(frozen=True, slots=True)
class CandidateView:
    """One backend serving the model, as the router sees it now.

    ``free_tokens`` and ``free_slots`` are the pool's, less what kvgate reserved and what requests routed there but
    not admitted yet will take; None while the pool is unknown. ``load`` matters only when ``resident`` is False
    (None: the load's cost can't be estimated)."""

    name: str
    resident: bool = True
    out: bool = False
    free_tokens: int | None = None
    free_slots: int | None = None
    unified: bool = False
    queue_length: int = 0
    need_tokens: int = 0
    """The request's tokens (prompt and output, estimated): a unified pool has room only with this many free."""
    load: LoadCost | None = None

    def standing(self) -> Standing:
        if not self.resident:
            if self.load is None:
                return Standing.LOAD_UNKNOWN
            if not self.load.possible:
                return Standing.CANNOT_LOAD
            return Standing.LOAD_EVICTS if self.evicts else Standing.LOAD_FITS
        if self.free_tokens is None or self.free_slots is None:
            return Standing.ROOM_UNKNOWN
        room = self.free_slots > 0 and self.queue_length == 0
        if self.unified:
            room = room and self.free_tokens >= self.need_tokens
        return Standing.ROOM_NOW if room else Standing.FULL

    @property
    def evicts(self) -> bool:
        return self.load is not None and (self.load.evict_bytes > 0 or self.load.evict_models > 0)


@dataclass(frozen=True, slots=True)
class Ranked:
    """A backend in the order to try, with its class and why it stands there (for ``X-Kvgate-Route``)."""

    name: str
    standing: Standing
    out: bool
    reason: str


def rank(candidates: Sequence[CandidateView], *, sticky: str | None = None) -> list[Ranked]:
    """The candidates, best first (see the module docstring); ``sticky`` names the conversation's backend."""
    order = sorted(range(len(candidates)), key=lambda i: _key(candidates[i], i))
    ranked = [Ranked(candidates[i].name, candidates[i].standing(), candidates[i].out, _reason(candidates[i]))
              for i in order]
    if sticky is None or not ranked:
        return ranked
    at = next((i for i, entry in enumerate(ranked) if entry.name == sticky), None)
    if at is None or at == 0:
        if at == 0:
            ranked[0] = _as_sticky(ranked[0])
        return ranked
    chosen, best = ranked[at], ranked[0]
    if chosen.out or (chosen.standing > best.standing and not best.out):
        return ranked  # it no longer fits: the best one takes the conversation
    return [_as_sticky(chosen), *ranked[:at], *ranked[at + 1:]]


def _as_sticky(entry: Ranked) -> Ranked:
    return Ranked(entry.name, entry.standing, entry.out, f"sticky, {entry.reason}")


def _key(view: CandidateView, index: int) -> tuple[int, int, int, int, int]:
    standing = view.standing()
    free = view.free_tokens or 0
    if standing is Standing.ROOM_NOW:
        within: tuple[int, int] = (-free, view.queue_length)
    elif standing in (Standing.ROOM_UNKNOWN, Standing.FULL):
        within = (view.queue_length, -free)
    elif standing is Standing.LOAD_EVICTS and view.load is not None:
        within = (view.load.evict_bytes, view.load.evict_models)
    else:
        within = (0, 0)
    return (int(view.out), int(standing), *within, index)


def _reason(view: CandidateView) -> str:
    """Why the backend stands where it does, in a few words: "resident, 3,072 tokens free"."""
    standing = view.standing()
    if standing is Standing.ROOM_NOW:
        text = f"resident, {view.free_tokens or 0:,} tokens free"
    elif standing is Standing.ROOM_UNKNOWN:
        text = "resident, pool not probed yet"
    elif standing is Standing.FULL:
        text = f"resident, full ({view.queue_length} queued)"
    elif standing is Standing.LOAD_FITS:
        text = "loads without eviction"
    elif standing is Standing.LOAD_EVICTS and view.load is not None:
        text = f"loads after evicting {view.load.evict_models} model(s), {view.load.evict_bytes / 2**30:.1f} GiB"
    elif standing is Standing.LOAD_UNKNOWN:
        text = "not resident, load cost unknown"
    else:
        text = "not resident, the GPU can't load it now"
    return f"out after failing, {text}" if view.out else text
