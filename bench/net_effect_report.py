"""The net-effect benchmark's numbers: one side of a cell summed up, the target, and the table (pure).

The target of a cell, printed per cell and in the exit code:

    kvgate completes at least what the backend alone completes, and fails nothing it did not;
    it refuses nothing the backend answered (a refusal, a 503 with Retry-After, stands only for what the backend
    failed, and a prompt it truncated silently is one it answered: kvgate must serve it, announced);
    where the backend failed any request (or truncated one silently), kvgate fails and truncates none;
    where the backend failed nothing, kvgate takes at most 1.1x its wall time, with at least 0.9x its generated
    tokens per second.

A dead backend's cell (nothing can complete) has its own target: every request answered with an error within 1 s.
A cell waiting for a later issue is printed with its figures and marked, never dropped or loosened.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.net_effect_client import Result

WALL_RATIO_MAX = 1.1
TOKENS_RATIO_MIN = 0.9
FAST_ERROR_S = 1.0


@dataclass(frozen=True)
class Side:
    """One run of a cell's workload, straight at the backends or through kvgate."""

    completed: int
    trimmed: int
    """Of ``completed``: answers whose history kvgate trimmed or summarized, and said so."""
    failed: int
    truncated: int
    """Answered 200 with a prompt the backend cut silently (the simulator counts every cut)."""
    refused: int
    timed_out: int
    tokens: int
    p50_s: float
    p95_s: float
    wall_s: float
    failures: tuple[str, ...] = ()
    """A few of the failures' and refusals' messages, for the details."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def requests(self) -> int:
        return self.completed + self.failed + self.truncated + self.refused + self.timed_out


def side_of(results: Sequence[Result], *, truncated: int, wall_s: float) -> Side:
    """Sum up one run; ``truncated`` answers (the simulator's count) move from completed to truncated."""
    ok = [r for r in results if r.ok]
    cut = min(truncated, sum(1 for r in ok if r.status == "completed"))
    latencies = sorted(r.latency_s for r in results)
    messages = tuple(dict.fromkeys(f"{r.status} {r.http_status}: {r.error}" for r in results if not r.ok))
    return Side(
        completed=len(ok) - cut, trimmed=sum(1 for r in ok if r.status == "trimmed"),
        failed=sum(1 for r in results if r.status == "failed"), truncated=cut,
        refused=sum(1 for r in results if r.status == "refused"),
        timed_out=sum(1 for r in results if r.status == "timed_out"),
        tokens=sum(r.tokens for r in ok), p50_s=_quantile(latencies, 0.50), p95_s=_quantile(latencies, 0.95),
        wall_s=wall_s, failures=messages[:4],
    )


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def median_side(runs: Sequence[Side]) -> Side:
    """Each figure's median over the rounds (counts rounded down to whole requests)."""
    def med(values: Sequence[float]) -> float:
        return statistics.median(values)

    return Side(
        completed=int(med([r.completed for r in runs])), trimmed=int(med([r.trimmed for r in runs])),
        failed=int(med([r.failed for r in runs])), truncated=int(med([r.truncated for r in runs])),
        refused=int(med([r.refused for r in runs])), timed_out=int(med([r.timed_out for r in runs])),
        tokens=int(med([r.tokens for r in runs])), p50_s=med([r.p50_s for r in runs]),
        p95_s=med([r.p95_s for r in runs]), wall_s=med([r.wall_s for r in runs]),
        failures=tuple(dict.fromkeys(m for r in runs for m in r.failures))[:4],
    )


@dataclass(frozen=True)
class Verdict:
    met: bool
    reasons: tuple[str, ...]
    wall_ratio: float | None
    tokens_ratio: float | None


def verdict(direct: Side, gated: Side, *, target: str = "net") -> Verdict:
    """Whether kvgate met the cell's target (see the module docstring), and why not."""
    wall_ratio = gated.wall_s / direct.wall_s if direct.wall_s > 0 else None
    tokens_ratio = gated.tokens_per_s / direct.tokens_per_s if direct.tokens_per_s > 0 else None
    reasons: list[str] = []
    if target == "fast_errors":  # nothing can complete: what counts is how soon each client knows it
        if gated.completed + gated.timed_out or gated.p95_s > FAST_ERROR_S:
            reasons.append(f"errors should come within {FAST_ERROR_S:g} s: p95 {gated.p95_s:.2f} s")
        return Verdict(not reasons, tuple(reasons), None, None)
    if gated.completed < direct.completed:
        reasons.append(f"completed {gated.completed} < {direct.completed}")
    if gated.failed + gated.timed_out > direct.failed + direct.timed_out:
        reasons.append(f"failed {gated.failed + gated.timed_out} > {direct.failed + direct.timed_out}")
    if gated.refused > direct.refused + direct.failed + direct.timed_out:
        reasons.append(f"refused {gated.refused} where the backend refused {direct.refused} and failed "
                       f"{direct.failed + direct.timed_out}")
    backend_failed = direct.failed + direct.truncated + direct.timed_out > 0
    if backend_failed and gated.failed + gated.truncated + gated.timed_out > 0:
        reasons.append(f"the backend failed, so kvgate must not: {gated.failed} failed, {gated.truncated} truncated, "
                       f"{gated.timed_out} timed out")
    if not backend_failed and direct.refused == 0:
        if wall_ratio is not None and wall_ratio > WALL_RATIO_MAX:
            reasons.append(f"wall time {wall_ratio:.2f}x > {WALL_RATIO_MAX}x")
        if tokens_ratio is not None and direct.tokens > 0 and tokens_ratio < TOKENS_RATIO_MIN:
            reasons.append(f"tokens/s {tokens_ratio:.2f}x < {TOKENS_RATIO_MIN}x")
    return Verdict(not reasons, tuple(reasons), wall_ratio, tokens_ratio)


HEADER = (f"{'cell':40} {'where':7} {'ok':>4} {'trim':>4} {'fail':>4} {'trunc':>5} {'refus':>5} {'t/o':>4} "
          f"{'tok/s':>7} {'p50 s':>6} {'p95 s':>6} {'wall s':>7}")


def row(name: str, where: str, side: Side) -> str:
    return (f"{name:40.40} {where:7} {side.completed:>4} {side.trimmed:>4} {side.failed:>4} {side.truncated:>5} "
            f"{side.refused:>5} {side.timed_out:>4} {side.tokens_per_s:>7.0f} {side.p50_s:>6.2f} {side.p95_s:>6.2f} "
            f"{side.wall_s:>7.2f}")


def verdict_line(result: Verdict, waits_for: str | None) -> str:
    ratios = []
    if result.wall_ratio is not None:
        ratios.append(f"wall {result.wall_ratio:.2f}x")
    if result.tokens_ratio is not None:
        ratios.append(f"tok/s {result.tokens_ratio:.2f}x")
    figures = ", ".join(ratios)
    if result.met:
        return f"{'':40} target met ({figures})" if figures else f"{'':40} target met"
    state = f"WAITS for {waits_for}" if waits_for else "TARGET MISSED"
    return f"{'':40} {state}: {'; '.join(result.reasons)}" + (f" ({figures})" if figures else "")
