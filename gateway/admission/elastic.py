"""Elastic reservations: a streamed reply's hold on a unified pool grows as it streams, and the pool never overruns.

Theory of operation
-------------------
A fixed reservation holds the prompt plus the whole output limit from the first token to the last, so on a unified
pool kvgate runs side by side only what fits if every answer ran to its limit. Most answers are far shorter. An
elastic one (planner rule 7) first holds the prompt plus what the model usually answers (``output_lengths``), and
kvgate follows the reply as it streams (``Growth.seen``, one call per chunk the relay reads, with the count of
stream events so far: llama-server and Ollama send one token an event):

    unified pool of 4,096 cells, admitted up to the 90% watermark (3,686), steps of 64
    | A 700 -> 764 -> 828 ... | B 700 | C 700 | D 700 | . . . free: growth room . . . |

    - when a reply comes within half a step of what it holds, it takes one more step (at most its limit) from
      the pool's free cells: the ledger's sum never passes the pool;
    - when the pool has no step left, admissions have already stopped (the watermark: new requests wait), and the
      reply goes on into its last quarter step, where the others may end and free cells;
    - a reply that reaches that last quarter with nothing free ends the one sequence that has passed its first
      reservation the most, itself or another: that reply's relay stops copying at an event boundary, the client
      gets a normal end (``finish_reason: length`` / ``done_reason: length``, with a ``kvgate`` field saying why),
      the upstream connection is closed (the backend stops the sequence) and its reservation is given back.

So the pool's invariant is "every sequence's current use fits its hold, and the holds fit the pool": each
reservation is at least what its reply has used plus the quarter step that covers events still on the wire.
``ElasticPools.check_invariants`` asserts it for the tests; the ledger's own invariant (totals match the live
reservations) holds after every step as before.

Only what kvgate can follow is elastic: a stream of one sequence in a dialect whose events it counts (Ollama,
OpenAI, llama-server chat and completion), or a reply that is not streamed on a server whose slots kvgate reads
(``slot_watch``: followed a poll apart, with the slack of two polls; ended only when no stream is left to end, as a
503 before any byte). ``n`` > 1 completions and batches hold fixed reservations and are never ended by kvgate.

What each reply may have generated unseen is part of its use (``lag_tokens``: an eighth of a step for a stream,
what two polls take at its rate for a reply read from the slots), so "use fits the hold" covers the backend's truth,
not only kvgate's count. With a shared ledger, ``grow`` answers False at once and sends the step through Redis
(``WaitingRoom.grow``, one script call): the hold grows when Redis confirms, between two of the reply's chunks; the
reply has a quarter step left before it must end anything, which is many Redis round trips.

Single-threaded, on the event loop, like the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.admission.permit import Permit
from gateway.admission.types import PoolKey, PoolSpec

log = logging.getLogger(__name__)

Grow = Callable[[Permit, int, PoolSpec], bool]
"""The waiting room's ``grow``: hold ``tokens`` in the pool instead, when its free cells allow (True)."""


@dataclass(eq=False, slots=True)
class Growth:
    """One elastic reply: what it holds (its permit), what it has used, and whether kvgate ended it."""

    permit: Permit
    pool: PoolSpec
    prompt_tokens: int
    """The prompt's part of the reservation (an estimate's with its margin)."""
    limit_tokens: int
    """The most it may hold: the prompt plus the whole output limit the backend was told."""
    first_tokens: int
    """What it reserved at admission."""
    owner: ElasticPools
    output_tokens: int = 0
    """Output tokens seen so far (stream events)."""
    steps: int = 0
    ended: str | None = None
    """Why kvgate ended the reply, once it has."""
    interrupt: Callable[[], object] | None = None
    """The relay's: stop copying now (set while the reply streams)."""
    streamed: bool = True
    """Followed by its stream's events; False: by the server's slots (``slot_watch``), and never ended cleanly."""
    lag_tokens: int | None = None
    """What it may have generated unseen; None: ``ElasticPools.lag_tokens``."""
    counted_tokens: int = 0
    """The hold its last counted step reached (a step through the shared ledger lands between two chunks)."""
    read_at: tuple[float, int] | None = None
    """When its slot was last read, and its output then (``slot_watch``)."""

    @property
    def held_tokens(self) -> int:
        return self.permit.reservation.tokens

    @property
    def used_tokens(self) -> int:
        """What it may hold on the backend now: the prompt, the output seen, and the tokens that may be generated
        but not yet seen (``ElasticPools.lag_tokens``: on the wire, or in the relay's coalescing); never more than
        its limit, where the backend stops it."""
        lag = self.owner.lag_tokens if self.lag_tokens is None else self.lag_tokens
        return min(self.limit_tokens, self.prompt_tokens + self.output_tokens + lag)

    @property
    def overshoot_tokens(self) -> int:
        """How far it has passed its first reservation (negative: not yet)."""
        return self.used_tokens - self.first_tokens

    def seen(self, output_tokens: int) -> bool:
        """The reply has streamed ``output_tokens`` so far: grow its hold if it must; False when kvgate ends it now."""
        self.output_tokens = output_tokens
        return self.owner.follow(self)


@dataclass(slots=True)
class ElasticCounts:
    """Per pool, since start: steps taken and replies kvgate ended."""

    steps_total: int = 0
    cuts_total: int = 0


@dataclass(slots=True)
class ElasticPools:
    """The elastic replies of every pool, grown and ended as the module docstring says."""

    grow: Grow
    step_tokens: int = 64
    _live: dict[PoolKey, dict[int, Growth]] = field(default_factory=dict)
    counts: dict[PoolKey, ElasticCounts] = field(default_factory=dict)

    @property
    def lag_tokens(self) -> int:
        """What the backend may have generated that the relay has not yet counted, or will generate while its
        connection closes: an eighth of a step, at least 4."""
        return max(4, self.step_tokens // 8)

    @property
    def guard_tokens(self) -> int:
        """The last part of a hold, kept for events still on the wire: a reply that reaches it with no room to
        grow ends one sequence (module docstring)."""
        return max(8, self.step_tokens // 4)

    def start(self, permit: Permit, pool: PoolSpec, prompt_tokens: int, *, streamed: bool = True) -> Growth | None:
        """Follow an admitted reply whose reservation is elastic (``Admit.limit_tokens``); None when it is fixed. A
        reply that is not streamed is read from the server's slots a poll apart: it may generate a step unseen."""
        limit = permit.admit.limit_tokens
        if limit is None:
            return None
        growth = Growth(permit, pool, prompt_tokens, limit, permit.reservation.tokens, self, streamed=streamed,
                        lag_tokens=None if streamed else self.step_tokens, counted_tokens=permit.reservation.tokens)
        self._live.setdefault(pool.key, {})[permit.reservation.id] = growth
        return growth

    def end(self, growth: Growth) -> None:
        """The reply is over (its permit is released next): it no longer grows or counts as a candidate."""
        live = self._live.get(growth.pool.key)
        if live is not None and live.pop(growth.permit.reservation.id, None) is not None and not live:
            del self._live[growth.pool.key]
        growth.interrupt = None

    def follow(self, growth: Growth) -> bool:
        if growth.ended is not None:
            return False
        held, used = growth.held_tokens, growth.used_tokens
        if held > growth.counted_tokens:  # a step the shared ledger confirmed since (or the one just taken)
            self._stepped(growth, held)
        if held >= growth.limit_tokens or used + self.step_tokens // 2 <= held:
            return True
        target = min(growth.limit_tokens, max(held, used) + self.step_tokens)
        if self.grow(growth.permit, target, growth.pool):
            self._stepped(growth, growth.held_tokens)
            return True
        if used + self.guard_tokens <= held:
            return True  # not yet: others may end before it reaches its last quarter step
        victim = max(self._candidates(growth), key=lambda g: g.overshoot_tokens)
        if victim is not growth and used < held:
            self._end(victim, growth.pool)
            return True  # its cells come back once its connection is closed; this one grows on its next chunk
        self._end(growth, growth.pool)
        return False

    def _stepped(self, growth: Growth, held: int) -> None:
        growth.counted_tokens = held
        growth.steps += 1
        self._counts(growth.pool.key).steps_total += 1

    def _candidates(self, needing: Growth) -> list[Growth]:
        """Who may be ended: the streams that can be ended cleanly (and the one that needs room); a reply that is
        not streamed only when nothing else is left."""
        live = [g for g in self._live.get(needing.pool.key, {}).values()
                if g.ended is None and (g is needing or g.interrupt is not None)]
        streams = [g for g in live if g.streamed]
        return streams or live or [needing]

    def _end(self, growth: Growth, pool: PoolSpec) -> None:
        growth.ended = (f"kvgate ended this reply at {growth.output_tokens:,} output tokens: the shared KV pool of "
                        f"{pool.backend} ({pool.pool_tokens:,} tokens) had no room for it to grow, and it had passed "
                        f"its first reservation ({growth.first_tokens:,} tokens) the most")
        self._counts(pool.key).cuts_total += 1
        log.warning("%s", growth.ended)
        if growth.interrupt is not None:
            growth.interrupt()

    def _counts(self, key: PoolKey) -> ElasticCounts:
        found = self.counts.get(key)
        if found is None:
            found = self.counts[key] = ElasticCounts()
        return found

    def growing(self, key: PoolKey) -> int:
        """Elastic replies running on the pool (for the status page)."""
        return len(self._live.get(key, ()))

    def check_invariants(self, pools: dict[PoolKey, PoolSpec]) -> None:
        """Every reply's use fits its hold (but for the guard its cut is allowed), and no hold passes its limit; the
        holds' sum fits the pool (the ledger's totals, read by the caller, cover fixed reservations too)."""
        for key, live in self._live.items():
            for growth in live.values():
                assert growth.held_tokens <= growth.limit_tokens, (growth.held_tokens, growth.limit_tokens)
                if growth.ended is None:
                    assert growth.used_tokens <= growth.held_tokens, (key, growth.used_tokens, growth.held_tokens)
            pool = pools.get(key)
            held = sum(g.held_tokens for g in live.values())
            assert pool is None or held <= pool.pool_tokens, (key, held, pool)
