"""What ``bench.elastic`` measured, per arm and mix: one round's figures, the rounds merged, the table and targets."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DIRECT, FIXED, ELASTIC = "direct", "kvgate fixed", "kvgate elastic"
ARMS = (DIRECT, FIXED, ELASTIC)
SHORT, LONG = "short mix", "long-tailed mix"
MIXES = (SHORT, LONG)


@dataclass
class Reply:
    """One streamed chat as the client saw it."""

    long: bool
    status: int = 0
    ttft_s: float | None = None
    tokens: int = 0
    done: bool = False
    """The stream ended normally (``data: [DONE]``) with no error event."""
    cut: bool = False
    """Its final chunk carries a ``kvgate`` field: kvgate ended it."""
    error: str = ""
    prompt_tokens: int = 0
    """kvgate's count (``X-Kvgate-Prompt-Tokens``); 0 straight at the backend."""

    @property
    def failed(self) -> bool:
        return not (self.status == 200 and self.done)


@dataclass
class Round:
    """One arm's run of one mix in one round."""

    replies: list[Reply]
    wall_s: float
    backend_failed: int = 0
    """The simulator's own count (``/sim/stats`` failed: context_exceeded among them) during the run; 0 on a real
    server."""
    kv_used: list[float] = field(default_factory=list)
    """Samples of the backend's KV cells in use (``/slots``: prompt + decoded of the busy slots) / its pool."""
    reserved: list[float] = field(default_factory=list)
    """Samples of kvgate's reserved tokens / the pool's capacity (``/kvgate/status``); none straight at it."""
    ended_by_kvgate: int = 0
    """The status page's ``ended_by_kvgate_total`` during the run."""
    elastic: int = 0
    """The status page's ``elastic_total`` during the run."""

    @property
    def completed(self) -> list[Reply]:
        return [r for r in self.replies if not r.failed]

    @property
    def failures(self) -> int:
        """Failed as the client saw them: not 200, an error event, or no end of stream."""
        return sum(r.failed for r in self.replies)

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.completed) / self.wall_s

    @property
    def requests_per_s(self) -> float:
        return len(self.completed) / self.wall_s


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


@dataclass
class Merged:
    """One arm's rounds of one mix: counts summed, rates the median round's, latencies and samples pooled."""

    rounds: list[Round]

    def median(self, what: str) -> float:
        return float(statistics.median(getattr(r, what) for r in self.rounds))

    @property
    def replies(self) -> list[Reply]:
        return [reply for r in self.rounds for reply in r.replies]

    @property
    def ttfts(self) -> list[float]:
        return [r.ttft_s for r in self.replies if r.ttft_s is not None and not r.failed]

    def summary(self) -> dict[str, Any]:
        replies = self.replies
        prompts = [r.prompt_tokens for r in replies if r.prompt_tokens]
        return {
            "requests": len(replies), "completed": sum(not r.failed for r in replies),
            "long": sum(r.long for r in replies), "failures": sum(r.failures for r in self.rounds),
            "backend_failed": sum(r.backend_failed for r in self.rounds),
            "cut": sum(r.cut for r in replies), "ended_by_kvgate": sum(r.ended_by_kvgate for r in self.rounds),
            "elastic": sum(r.elastic for r in self.rounds),
            "wall_s": self.median("wall_s"), "requests_per_s": self.median("requests_per_s"),
            "tokens_per_s": self.median("tokens_per_s"),
            "ttft_p50_ms": _quantile(self.ttfts, 0.5) * 1000, "ttft_p95_ms": _quantile(self.ttfts, 0.95) * 1000,
            "kv_used": _mean([s for r in self.rounds for s in r.kv_used]),
            "reserved": _mean([s for r in self.rounds for s in r.reserved]),
            "prompt_tokens": statistics.median(prompts) if prompts else None,
            "errors": [f"{n}x {text}" for text, n in Counter(r.error[:120] for r in replies if r.error).most_common(3)],
        }


def ratio(rounds_a: Sequence[Round], rounds_b: Sequence[Round], what: str) -> float:
    """The median of the per-round ratios a / b (rounds paired: the same round's noise hits both)."""
    return float(statistics.median(getattr(a, what) / getattr(b, what)
                                   for a, b in zip(rounds_a, rounds_b, strict=True)))


HEADER = (f"{'mix':<16} {'arm':<15} {'done':>5} {'fail':>4} {'cut':>4} {'long':>4} {'wall s':>7} {'req/s':>6} "
          f"{'tok/s':>7} {'ttft p50':>8} {'ttft p95':>8} {'KV used':>7} {'reserved':>8}")


def _or_dash(value: float, form: str, unit: str = "") -> str:
    return "-" if value != value else format(value, form) + unit  # NaN: nothing to measure


def _row(mix: str, arm: str, s: dict[str, Any]) -> str:
    return (f"{mix:<16} {arm:<15} {s['completed']:>5} {s['failures']:>4} {s['cut']:>4} {s['long']:>4} "
            f"{s['wall_s']:>7.2f} {s['requests_per_s']:>6.2f} {s['tokens_per_s']:>7.0f} "
            f"{_or_dash(s['ttft_p50_ms'], '.0f', 'ms'):>8} {_or_dash(s['ttft_p95_ms'], '.0f', 'ms'):>8} "
            f"{_or_dash(s['kv_used'], '.0%'):>7} {_or_dash(s['reserved'], '.0%'):>8}")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def targets(runs: dict[str, dict[str, list[Round]]]) -> list[tuple[str, bool | None]]:
    """(line, met) for every target; met None: reported, not a target."""
    summaries = {mix: {arm: Merged(rounds).summary() for arm, rounds in arms.items()} for mix, arms in runs.items()}
    lines: list[tuple[str, bool | None]] = []
    failures = {mix: s[ELASTIC]["failures"] + s[ELASTIC]["backend_failed"] for mix, s in summaries.items()}
    fixed_failures = {mix: s[FIXED]["failures"] + s[FIXED]["backend_failed"] for mix, s in summaries.items()}
    lines.append((f"backend failures through kvgate elastic = 0 (client's and simulator's): {failures} "
                  f"(fixed: {fixed_failures})",
                  all(v == 0 for v in failures.values())))
    if SHORT in summaries:
        cut = summaries[SHORT][ELASTIC]["cut"]
        lines.append((f"answers cut by kvgate on the short mix = 0: {cut}", cut == 0))
        direct = summaries[SHORT][DIRECT]
        if direct["failures"]:  # it ended sooner by failing: no time to compare with
            lines.append((f"elastic wall time <= 1.1x direct on the short mix: not comparable, the backend alone "
                          f"failed {direct['failures']} of {direct['requests']} ({direct['errors'][:1]})", None))
        else:
            wall = ratio(runs[SHORT][ELASTIC], runs[SHORT][DIRECT], "wall_s")
            lines.append((f"elastic wall time <= 1.1x direct on the short mix: {wall:.2f}x", wall <= 1.1))
    if LONG in summaries:
        s = summaries[LONG]
        cut, asked, direct_failed = s[ELASTIC]["cut"], s[ELASTIC]["requests"], s[DIRECT]["failures"]
        ok = cut <= 0.01 * asked and (cut == 0 or cut < direct_failed)
        lines.append((f"answers cut by kvgate on the long-tailed mix <= 1% and fewer than direct's failures: "
                      f"{cut} of {asked} ({cut / asked:.1%}); direct failed {direct_failed} "
                      f"{s[DIRECT]['errors'][:1]}", ok))
    for mix in summaries:
        tokens = ratio(runs[mix][ELASTIC], runs[mix][FIXED], "tokens_per_s")
        requests = ratio(runs[mix][ELASTIC], runs[mix][FIXED], "requests_per_s")
        ttft = summaries[mix][ELASTIC]["ttft_p95_ms"] / summaries[mix][FIXED]["ttft_p95_ms"]
        lines.append((f"elastic vs fixed goodput, {mix}: {tokens:.2f}x tokens/s, {requests:.2f}x requests/s, "
                      f"p95 time to first token {ttft:.2f}x", None))
    return lines


def render(title: str, runs: dict[str, dict[str, list[Round]]]) -> str:
    lines = [title, HEADER, "-" * len(HEADER)]
    for mix, arms in runs.items():
        for arm, arm_rounds in arms.items():
            lines.append(_row(mix, arm, Merged(arm_rounds).summary()))
    count = len(next(iter(next(iter(runs.values())).values())))
    lines.append(f"(done/fail/cut/long: requests summed, as the client saw them, over {count} round(s); wall, "
                 "req/s, tok/s: the median round; tok/s counts the tokens of completed replies; ttft: all completed "
                 "replies pooled; KV used: the "
                 "backend's /slots (prompt + decoded of busy slots) / pool, mean of 10 Hz samples; reserved: "
                 "kvgate's /kvgate/status reserved / capacity, same samples)")
    prompts = [Merged(r).summary()["prompt_tokens"] for arms in runs.values() for r in arms.values()]
    counted = [p for p in prompts if p]
    if counted:
        lines.append(f"(prompts: median {statistics.median(counted):.0f} tokens, kvgate's count)")
    for mix, arms in runs.items():
        counts = {arm: Merged(arms[arm]).summary() for arm in (FIXED, ELASTIC)}
        own = ", ".join(f"{arm} {Merged(rounds).summary()['backend_failed']}" for arm, rounds in arms.items())
        lines.append(f"(the simulator's own failed requests, {mix}: {own}; 0 on a real server)")
        lines.append(f"(status page, {mix}: elastic_total " + ", ".join(
            f"{arm} {c['elastic']}, ended_by_kvgate_total {c['ended_by_kvgate']}" for arm, c in counts.items())
            + ")")
    for text, met in targets(runs):
        lines.append(f"{'target' if met is not None else 'report'}: {text}"
                     + (f" -> {_verdict(met)}" if met is not None else ""))
    return "\n".join(lines)
