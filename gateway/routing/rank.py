"""Which backend a request goes to, when several serve its model: a pure ranking by expected time to first token.

Theory of operation
-------------------
The router (router.py) builds one ``CandidateView`` per backend that serves the model, from the pool directory,
the ledger, the waiting room, what it learned of service and load times, and the outage book; ``rank`` orders them,
best first, and says why with the numbers it compared. The request goes to the first; if that one fails before
anything reached the client, to the next, and so on.

Each backend's expected wait before this request's first token::

    resident     ahead = busy + waiting + this request's sequences - slots       (none ahead: 0 s)
                 wait  = ahead x service_s / slots
    not loaded   wait  = load_s + (waiting + sequences - slots) x service_s / slots    (the same queue, after a load)

- ``busy``: sequences admitted in the pool (the ledger); ``waiting``: requests routed there and not admitted yet, or
  queued in kvgate's waiting room (the larger: a queued request is both), for every pool kind, known or not yet
  probed; a unified pool whose free tokens can't hold the request has at least one ahead.
- ``service_s``: the moving median of the pool's recent requests, admitted to released (``routing.default_service_s``
  before any); ``load_s``: the backend's own ``load_duration`` of recent loads (``routing.default_load_s`` before
  any); ``slots`` of a pool not known yet: the backend's learned parallel, else what the model runs with elsewhere.
- A load counts only where the model fits without evicting anything busy: the GPU preview says it fits, or fits
  after unloading idle models; without a GPU reading, only while no other model runs there through kvgate (the
  load might have to wait for it: its wait is unknown). A load that can't happen now has no wait at all.

Order: healthy before out (a backend taken out after a failure, outages.py, is used only if nothing else is left);
then the shortest expected wait; an unknown one after every known one; ties by class (resident with room, pool not
probed, resident and full, load without eviction, load after eviction, load unchecked, cannot load), then within it
(room: most free KV; full: fewest ahead; eviction: fewest bytes), then the order of the configuration.

Sticky conversations: a conversation's backend (the one holding its prompt cache) goes first while it is healthy and
its expected wait is at most ``sticky_slack_s`` longer than the best one's; past that, the best takes it.

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

DEFAULT_SERVICE_S = 5.0
DEFAULT_LOAD_S = 5.0
DEFAULT_STICKY_SLACK_S = 1.0
MAX_COMPARED = 3
"""Other backends the route header names (the best after the chosen one)."""


class Standing(IntEnum):
    """The kind of wait a backend offers (lower is better at equal waits); the classes of the module docstring."""

    ROOM_NOW = 1
    ROOM_UNKNOWN = 2
    FULL = 3
    LOAD_FITS = 4
    LOAD_EVICTS = 5
    LOAD_UNKNOWN = 6
    CANNOT_LOAD = 7


@dataclass(frozen=True, slots=True)
class LoadCost:
    """Loading the model on a backend where it is not resident: nothing to unload (``evict_bytes`` 0), idle models
    to unload, or no load possible now (``possible`` False); ``checked`` False without a GPU reading, where
    ``waits_for_busy`` says another model runs there (the load may wait for it); ``load_s`` is the expected load."""

    possible: bool = True
    evict_bytes: int = 0
    evict_models: int = 0
    load_s: float = DEFAULT_LOAD_S
    checked: bool = True
    waits_for_busy: bool = False


@dataclass(frozen=True, slots=True)
class CandidateView:
    """One backend serving the model, as the router sees it now.

    ``slots`` is the pool's (None while the pool is unknown: ``slots_guess`` stands in); ``busy`` its admitted
    sequences; ``waiting`` the requests ahead of this one not admitted yet (routed there, or queued);
    ``free_tokens`` the pool's tokens less what is reserved and what the waiting requests will take (None: pool
    unknown). ``load`` matters only when ``resident`` is False (None: nothing known of a load)."""

    name: str
    resident: bool = True
    out: bool = False
    slots: int | None = None
    busy: int = 0
    waiting: int = 0
    free_tokens: int | None = None
    unified: bool = False
    need_tokens: int = 0
    """The request's tokens (prompt and output, estimated): a unified pool has room only with this many free."""
    sequences: int = 1
    service_s: float = DEFAULT_SERVICE_S
    slots_guess: int = 1
    load: LoadCost | None = None

    @property
    def known_slots(self) -> int:
        return max(1, self.slots if self.slots is not None else self.slots_guess)

    def ahead(self) -> int:
        """Sequences that must end before this request gets a slot."""
        slots = self.known_slots
        if not self.resident:
            return max(0, self.waiting + self.sequences - slots)
        ahead = max(0, self.busy + self.waiting + self.sequences - slots)
        if self.unified and self.free_tokens is not None and self.free_tokens < self.need_tokens:
            ahead = max(ahead, 1)
        return ahead

    def queue_s(self) -> float:
        return self.ahead() * self.service_s / self.known_slots

    def expected_s(self) -> float | None:
        """Seconds until this request would start here; None when no estimate can be made (module docstring)."""
        if self.resident:
            return self.queue_s()
        load = self.load
        if load is None or not load.possible or load.waits_for_busy:
            return None
        return load.load_s + self.queue_s()

    def standing(self) -> Standing:
        if not self.resident:
            if self.load is None or self.load.waits_for_busy:
                return Standing.LOAD_UNKNOWN
            if not self.load.possible:
                return Standing.CANNOT_LOAD
            if not self.load.checked:
                return Standing.LOAD_UNKNOWN
            return Standing.LOAD_EVICTS if self.evicts else Standing.LOAD_FITS
        if self.slots is None:
            return Standing.ROOM_UNKNOWN
        return Standing.ROOM_NOW if self.ahead() == 0 else Standing.FULL

    @property
    def evicts(self) -> bool:
        return self.load is not None and (self.load.evict_bytes > 0 or self.load.evict_models > 0)


@dataclass(frozen=True, slots=True)
class Ranked:
    """A backend in the order to try, with its class, its expected wait and why it stands there (the route
    header: its own numbers, then those of the backends it was compared with)."""

    name: str
    standing: Standing
    out: bool
    reason: str
    expected_s: float | None = None


def rank(candidates: Sequence[CandidateView], *, sticky: str | None = None,
         sticky_slack_s: float = DEFAULT_STICKY_SLACK_S) -> list[Ranked]:
    """The candidates, best first (see the module docstring); ``sticky`` names the conversation's backend."""
    order = sorted(range(len(candidates)), key=lambda i: _key(candidates[i], i))
    views = [candidates[i] for i in order]
    if sticky is not None and views:
        at = next((i for i, view in enumerate(views) if view.name == sticky), None)
        if at is not None and _keeps(views[at], views[0], sticky_slack_s):
            views = [views[at], *views[:at], *views[at + 1:]]
        else:
            sticky = None
    ranked = []
    for view in views:
        others = [other for other in views if other is not view][:MAX_COMPARED]
        own = _clause(view, chosen=True)
        reason = "; ".join([f"sticky, {own}" if view.name == sticky else own,
                            *(f"{other.name}: {_clause(other, chosen=False)}" for other in others)])
        ranked.append(Ranked(view.name, view.standing(), view.out, reason, view.expected_s()))
    return ranked


def _keeps(mine: CandidateView, best: CandidateView, slack_s: float) -> bool:
    """Whether a conversation stays on its backend ``mine`` rather than move to the best one."""
    if mine is best:
        return True
    if mine.out and not best.out:
        return False
    wait, best_wait = mine.expected_s(), best.expected_s()
    if wait is None:
        return best_wait is None and mine.standing() <= best.standing()
    return best_wait is None or best.out or wait <= best_wait + slack_s


def _key(view: CandidateView, index: int) -> tuple[int, int, float, int, float, float, int]:
    standing = view.standing()
    wait = view.expected_s()
    free = view.free_tokens or 0
    if standing is Standing.ROOM_NOW:
        within: tuple[float, float] = (-free, view.busy + view.waiting)
    elif standing in (Standing.ROOM_UNKNOWN, Standing.FULL):
        within = (view.ahead(), -free)
    elif standing is Standing.LOAD_EVICTS and view.load is not None:
        within = (view.load.evict_bytes, view.load.evict_models)
    else:
        within = (view.ahead(), 0)
    return (int(view.out), int(wait is None), round(wait or 0.0, 3), int(standing), *within, index)


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 1 or value == 0 else f"{value:.2f} s"


def _queue(view: CandidateView) -> str:
    """"6 ahead x 1.4 s / 2 slots", or how many slots are free when none is ahead."""
    slots = view.known_slots
    ahead = view.ahead()
    plural = "" if slots == 1 else "s"
    if ahead:
        return f"{ahead} ahead x {_seconds(view.service_s)} / {slots} slot{plural}"
    free = slots - view.busy - view.waiting if view.resident else slots - view.waiting
    return f"{max(0, free)} of {slots} slot{plural} free"


def _clause(view: CandidateView, *, chosen: bool) -> str:
    """The backend's numbers in a few words: the chosen one's with what it is, the others' shorter."""
    text = _resident(view, chosen) if view.resident else _loading(view, view.standing(), chosen)
    return f"out after failing, {text}" if view.out else text


def _resident(view: CandidateView, chosen: bool) -> str:
    wait = _seconds(view.queue_s())
    guessed = "" if view.slots is not None else ", pool not probed yet"
    tokens = f", {max(0, view.free_tokens):,} tokens free" if view.free_tokens is not None and chosen else ""
    if chosen:
        return f"resident, first token in {wait} ({_queue(view)}{tokens}{guessed})"
    return f"{wait} ({_queue(view)}{guessed})"


def _loading(view: CandidateView, standing: Standing, chosen: bool) -> str:
    load = view.load
    if standing is Standing.CANNOT_LOAD:
        return "not resident, the GPU can't load it now"
    if load is None:
        return "not resident, load cost unknown"
    if load.waits_for_busy:
        return "not resident, its load may wait for the models running there (no GPU reading)"
    queue = "" if not view.ahead() else f" + {_queue(view)}"
    what = f"load {_seconds(load.load_s)}{queue}"
    if standing is Standing.LOAD_EVICTS:
        what += f" after evicting {load.evict_models} idle model(s), {load.evict_bytes / 2**30:.1f} GiB"
    elif not load.checked:
        what += ", no GPU reading"
    if not chosen:
        return what
    kind = "loads after eviction" if standing is Standing.LOAD_EVICTS else \
        "loads without eviction" if load.checked else "loads"
    return f"{kind}, first token in {_seconds(view.expected_s() or 0.0)} ({what})"
