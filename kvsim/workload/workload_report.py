"""Side-by-side table of two workload runs ("direct" vs "through kvgate")."""

from __future__ import annotations

from collections.abc import Callable

from kvsim.workload.workload import RunReport

Row = tuple[str, Callable[[RunReport], str]]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _latency(report: RunReport, q: float) -> str:
    done = [o.latency_s for o in report.outcomes if o.status in ("completed", "truncated", "trimmed")]
    return f"{_percentile(done, q):.2f}" if done else "-"


ROWS: tuple[Row, ...] = (
    ("requests", lambda r: str(len(r.outcomes))),
    ("completed", lambda r: str(r.count("completed"))),
    ("silently truncated", lambda r: str(r.count("truncated"))),
    ("trimmed, announced", lambda r: str(r.count("trimmed"))),
    ("failed: out of memory", lambda r: str(r.count("failed_oom"))),
    ("failed: other 5xx", lambda r: str(r.count("failed_500"))),
    ("refused (4xx)", lambda r: str(r.count("failed_4xx"))),
    ("timed out (still waiting)", lambda r: str(r.count("timed_out"))),
    ("model reloads", lambda r: str(r.reloads)),
    ("p50 latency (s)", lambda r: _latency(r, 0.5)),
    ("p95 latency (s)", lambda r: _latency(r, 0.95)),
    ("generated tokens", lambda r: str(sum(o.generated_tokens for o in r.outcomes))),
    ("wall time (s)", lambda r: f"{r.wall_s:.1f}"),
)


def render_comparison(left: RunReport, right: RunReport) -> str:
    """A plain-text table, one row per measure, one column per run."""
    label_w = max(len(label) for label, _ in ROWS)
    cols = [(left.name, [fn(left) for _, fn in ROWS]), (right.name, [fn(right) for _, fn in ROWS])]
    widths = [max(len(name), *(len(v) for v in values)) for name, values in cols]
    lines = [" " * label_w + "".join(f"  {name:>{w}}" for (name, _), w in zip(cols, widths, strict=True))]
    for i, (label, _) in enumerate(ROWS):
        cells = "".join(f"  {values[i]:>{w}}" for (_, values), w in zip(cols, widths, strict=True))
        lines.append(f"{label:<{label_w}}{cells}")
    return "\n".join(lines)


def render_outcomes(report: RunReport) -> str:
    """One line per request: who, which phase, what happened."""
    lines = []
    for o in report.outcomes:
        detail = o.error[:90] if o.error else f"prompt {o.prompt_tokens_reported}/{o.prompt_tokens_known} tokens"
        lines.append(f"{o.call.phase:<8} {o.call.user:<8} {o.status:<11} {o.latency_s:6.2f}s  {detail}")
    return "\n".join(lines)
