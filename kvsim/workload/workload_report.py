"""Side-by-side table of two workload runs ("direct" vs "through kvgate"): ``ROWS`` for the six users on one model,
``MULTI_MODEL_ROWS`` for the multi-model phase; ``sections`` add the latter under a title in the same table."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvsim.workload.multi_model import model_switches, multi_model_script
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
    ("refused (503, Retry-After)", lambda r: str(r.count("refused"))),
    ("timed out (still waiting)", lambda r: str(r.count("timed_out"))),
    ("model reloads", lambda r: str(r.reloads)),
    ("p50 latency (s)", lambda r: _latency(r, 0.5)),
    ("p95 latency (s)", lambda r: _latency(r, 0.95)),
    ("generated tokens", lambda r: str(sum(o.generated_tokens for o in r.outcomes))),
    ("wall time (s)", lambda r: f"{r.wall_s:.1f}"),
)


def _gateway_count(value: int | None) -> str:
    return "-" if value is None else str(value)


MULTI_MODEL_LABEL = "3 models: "
"""Every multi-model row's label starts so (they share the demo's table with ``ROWS``)."""
MULTI_MODEL_ROWS: tuple[Row, ...] = tuple((MULTI_MODEL_LABEL + label, fn) for label, fn in (
    ("requests", lambda r: str(len(r.outcomes))),
    ("completed", lambda r: str(r.count("completed") + r.count("trimmed") + r.count("truncated"))),
    ("failed: out of memory", lambda r: str(r.count("failed_oom"))),
    ("failed: other", lambda r: str(r.count("failed_500") + r.count("failed_4xx") + r.count("timed_out"))),
    ("refused (503, Retry-After)", lambda r: str(r.count("refused"))),
    ("model switches", lambda _: str(model_switches(multi_model_script()[0]))),
    ("loads (GPU)", lambda r: str(r.loads)),
    ("loads that hit OOM (GPU)", lambda r: str(r.load_failures)),
    ("runner crashes: OOM (GPU)", lambda r: str(r.runtime_ooms)),
    ("unloads (GPU)", lambda r: str(r.unloads)),
    ("loads by kvgate", lambda r: _gateway_count(r.gateway_loads)),
    ("unloads by kvgate", lambda r: _gateway_count(r.gateway_unloads)),
    ("wall time (s)", lambda r: f"{r.wall_s:.1f}"),
))  # fmt: skip

Section = tuple[str, RunReport, RunReport, Sequence[Row]]
"""(title, left run, right run, rows): more rows under a title, in the same columns."""


def render_comparison(left: RunReport, right: RunReport, rows: Sequence[Row] = ROWS, *,
                      sections: Sequence[Section] = ()) -> str:  # fmt: skip
    """A plain-text table, one row per measure, one column per run; each section adds a title line and its rows."""
    blocks: list[tuple[str, RunReport, RunReport, Sequence[Row]]] = [("", left, right, rows), *sections]
    label_w = max(len(label) for *_, block_rows in blocks for label, _ in block_rows)
    cells = [[(label, fn(a), fn(b)) for label, fn in block_rows] for _, a, b, block_rows in blocks]
    widths = [max(len(left.name), *(len(c[1]) for block in cells for c in block)),
              max(len(right.name), *(len(c[2]) for block in cells for c in block))]  # fmt: skip
    lines = [" " * label_w + f"  {left.name:>{widths[0]}}  {right.name:>{widths[1]}}"]
    for (title, *_), block in zip(blocks, cells, strict=True):
        if title:
            lines.append(title)
        lines.extend(f"{label:<{label_w}}  {a:>{widths[0]}}  {b:>{widths[1]}}" for label, a, b in block)
    return "\n".join(lines)


def render_outcomes(report: RunReport) -> str:
    """One line per request: who, which phase, what happened."""
    lines = []
    for o in report.outcomes:
        detail = o.error[:90] if o.error else f"prompt {o.prompt_tokens_reported}/{o.prompt_tokens_known} tokens"
        lines.append(f"{o.call.phase:<8} {o.call.user:<8} {o.status:<11} {o.latency_s:6.2f}s  {detail}")
    return "\n".join(lines)
