"""The report of bench/scale.py: shares of the contended windows, latencies, targets, the table."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench.fair_sim import max_min_fair
from bench.scale_workload import (
    ADDED_MEDIAN_TARGET_S,
    CONTENDED_QUEUED,
    CONTEXT_EXCEEDED,
    HOST_CONTEXTS,
    SHARE_OF_SINGLE,
    SHARE_TARGET,
    TENANTS,
    WINDOWS,
    Planned,
    Run,
    Scale,
)

# --- the report -----------------------------------------------------------------------------------------------------


@dataclass
class Shares:
    windows: int
    served: dict[str, int]
    fair: dict[str, float]

    def share(self, tenant: str) -> float:
        return self.served[tenant] / max(sum(self.served.values()), 1)

    def fair_share(self, tenant: str) -> float:
        return self.fair[tenant] / max(sum(self.served.values()), 1)

    def of_fair(self, tenant: str) -> float:
        return self.served[tenant] / self.fair[tenant] if self.fair[tenant] else float("nan")


def shares(run: Run) -> Shares:
    """Reserved tokens per tenant admitted in the contended windows against the max-min fair split of them. A window
    is one backend's pool for 15 simulated minutes (fair queueing shares each pool's queue: a tenant alone on an
    idle host takes all of that host, and that is no unfairness); it is contended when at least CONTENDED_QUEUED of
    its requests queued. In each, what a tenant asked is what it had waiting there (arrived before the window ends,
    admitted after it began), and the window's capacity is what was admitted in it."""
    width_s = run.scale.day_s / WINDOWS
    admitted = [a for a in run.answers if a.wait_s is not None]
    queued: Counter[tuple[int, str]] = Counter()
    for a in admitted:
        if a.wait_s:
            queued[(_window(a.planned.at_s + a.wait_s, width_s), a.backend)] += 1
    contended = sorted(key for key, count in queued.items() if count >= CONTENDED_QUEUED)
    served = dict.fromkeys(TENANTS, 0)
    fair = dict.fromkeys(TENANTS, 0.0)
    weights = {name: t.weight for name, t in TENANTS.items()}
    for window, backend in contended:
        start_s, end_s = window * width_s, (window + 1) * width_s
        got, asked = dict.fromkeys(TENANTS, 0), dict.fromkeys(TENANTS, 0.0)
        for a in admitted:
            if a.backend != backend:
                continue
            admitted_s = a.planned.at_s + a.wait_s  # type: ignore[operator]
            if start_s <= admitted_s < end_s or (window == WINDOWS - 1 and admitted_s >= end_s):
                got[a.planned.tenant] += a.reserved_tokens
            if a.planned.at_s < end_s and admitted_s >= start_s:
                asked[a.planned.tenant] += a.reserved_tokens
        for tenant, tokens in max_min_fair(asked, weights, sum(got.values())).items():
            fair[tenant] += tokens
        for tenant, tokens in got.items():
            served[tenant] += tokens
    return Shares(len(contended), served, fair)


def _window(at_s: float, width_s: float) -> int:
    return min(WINDOWS - 1, int(at_s / width_s))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Summary:
    config: str
    requests: int
    ok: int
    refused: dict[str, int]
    out_of_memory: int
    other_errors: int
    queued: int
    shares: Shares
    added_ms: list[float]  # idle probes
    loaded_ms: list[float]  # the day's requests admitted without waiting
    wall_s: float
    lost_races: int
    turns_kept: int
    lag_ms: list[float]
    elastic_steps: int = 0
    elastic_ends: int = 0

    @property
    def added_median_ms(self) -> float:
        return statistics.median(self.added_ms) if self.added_ms else float("nan")

    @property
    def added_p99_ms(self) -> float:
        return _quantile(self.added_ms, 0.99)


def summarise(run: Run) -> Summary:
    refused: dict[str, int] = {}
    other = 0
    for a in run.answers:
        if a.status == 200 or a.out_of_memory:
            continue
        if a.wait_s is None and 400 <= a.status < 600:
            refused[f"{a.status} {a.code}"] = refused.get(f"{a.status} {a.code}", 0) + 1
        else:
            other += 1
    added = [a.added_s * 1000 for a in run.probes if a.added_s is not None]
    loaded = [a.added_s * 1000 for a in run.answers if a.added_s is not None]
    return Summary(run.config, len(run.answers), sum(a.status == 200 and not a.out_of_memory for a in run.answers),
                   refused, sum(a.out_of_memory for a in run.answers), other,
                   sum(1 for a in run.answers if a.wait_s), shares(run), added, loaded,
                   run.wall_s, run.lost_races, run.turns_kept, run.lag_ms, run.elastic_steps, run.elastic_ends)


def share_target(tenant: str, single: Summary | None) -> tuple[float, str]:
    """What the shared ledger must give a tenant, as a fraction of its fair share: SHARE_TARGET, or, where one
    in-process waiting room on the same traffic (``single``, measured in the same run) does not reach that itself,
    SHARE_OF_SINGLE of what it gets there. The measure has a floor below 100% for any scheduler: a light tenant's
    request that waits for capacity across a window's end counts as unmet demand in that window."""
    if single is None or not single.shares.fair[tenant]:
        return SHARE_TARGET, ""
    of_single = SHARE_OF_SINGLE * single.shares.of_fair(tenant)
    if of_single < SHARE_TARGET:
        return of_single, f": {SHARE_OF_SINGLE:.0%} of one waiting room's {single.shares.of_fair(tenant):.0%}"
    return SHARE_TARGET, ""


def misses(summaries: dict[str, Summary]) -> list[str]:
    shared = summaries.get("shared")
    if shared is None:
        return ["the shared configuration did not run"]
    missed = []
    if shared.out_of_memory:
        missed.append(f"shared ledger: {shared.out_of_memory} requests met '{CONTEXT_EXCEEDED}'")
    single = summaries.get("single")
    for tenant in TENANTS:
        if not shared.shares.fair[tenant]:
            continue
        target, why = share_target(tenant, single)
        if shared.shares.of_fair(tenant) < target:
            missed.append(f"shared ledger: {tenant} got {shared.shares.of_fair(tenant):.0%} of its fair share "
                          f"(target >= {target:.0%}{why})")
    independent = summaries.get("independent")
    if independent is not None:
        extra_ms = shared.added_median_ms - independent.added_median_ms
        if not extra_ms <= ADDED_MEDIAN_TARGET_S * 1000:
            missed.append(f"shared ledger: adds {extra_ms:.1f} ms to the median request over in-process ledgers "
                          f"(target <= {ADDED_MEDIAN_TARGET_S * 1000:g} ms)")
    return missed


def render(plan: list[Planned], scale: Scale, summaries: dict[str, Summary]) -> str:
    per_tenant = {t: sum(p.tenant == t for p in plan) for t in TENANTS}
    lines = [
        f"{len(HOST_CONTEXTS)} simulated llama-servers (unified KV, 4 slots; -c "
        + ", ".join(f"{c}" for c in HOST_CONTEXTS) + f"), time_scale {scale.time_scale:g}; a day in "
        f"{scale.day_s:g} s; {len(plan)} requests: " + ", ".join(f"{t} {n}" for t, n in per_tenant.items()),
        "",
        f"{'configuration':<14} {'requests':>8} {'ok':>6} {'refused':>8} {'OOM':>5} {'other':>6} {'queued':>7} "
        f"{'lost races':>10} {'turns kept':>10} {'added median':>13} {'added p99':>10} {'loaded median':>13} "
        f"{'loop lag p99':>12} {'wall':>7}",
    ]
    for s in summaries.values():
        lines.append(f"{s.config:<14} {s.requests:>8} {s.ok:>6} {sum(s.refused.values()):>8} {s.out_of_memory:>5} "
                     f"{s.other_errors:>6} {s.queued:>7} {s.lost_races:>10} {s.turns_kept:>10} "
                     f"{s.added_median_ms:>10.2f} ms "
                     f"{s.added_p99_ms:>7.2f} ms {_median(s.loaded_ms):>10.1f} ms {_quantile(s.lag_ms, 0.99):>9.1f} ms "
                     f"{s.wall_s:>6.1f}s")
    for s in summaries.values():
        lines.append(f"  {s.config} elastic reservations: {s.elastic_steps:,} growth steps, {s.elastic_ends} replies "
                     "ended by kvgate")
    for s in summaries.values():
        if s.refused:
            lines.append(f"  {s.config} refused: " + ", ".join(f"{n} x {why}" for why, n in sorted(s.refused.items())))
    lines += ["", "reserved tokens admitted in the contended windows, share against the weighted max-min fair share:",
              f"{'configuration':<14} {'windows':>7} " + " ".join(f"{t + ' (w ' + format(w.weight, 'g') + ')':>22}"
                                                             for t, w in TENANTS.items())]
    for s in summaries.values():
        cells = [f"{s.shares.share(t):>6.1%} /{s.shares.fair_share(t):>6.1%} ={s.shares.of_fair(t):>5.0%}"
                 for t in TENANTS]
        lines.append(f"{s.config:<14} {s.shares.windows:>7} " + " ".join(f"{c:>22}" for c in cells))
    lines.append("(share / fair share = of fair)")
    missed = misses(summaries)
    lines.append(f"targets (shared ledger): no out-of-memory; every tenant >= {SHARE_TARGET:.0%} of its fair share (or "
                 f">= {SHARE_OF_SINGLE:.0%} of what one waiting room gives it, where that is less); "
                 f"<= {ADDED_MEDIAN_TARGET_S * 1000:g} ms added to the median over in-process ledgers -> "
                 f"{'FAIL' if missed else 'PASS'}")
    lines.extend(f"  missed: {m}" for m in missed)
    return "\n".join(lines)


def summary_json(s: Summary) -> dict[str, Any]:
    return {"requests": s.requests, "ok": s.ok, "refused": s.refused, "out_of_memory": s.out_of_memory,
            "other_errors": s.other_errors, "queued": s.queued, "lost_races": s.lost_races, "turns_kept": s.turns_kept,
            "elastic_steps": s.elastic_steps, "elastic_ends": s.elastic_ends,
            "wall_s": round(s.wall_s, 2), "loop_lag_p99_ms": round(_quantile(s.lag_ms, 0.99), 2),
            "added_ms": {"median": round(s.added_median_ms, 3),
                                                       "p99": round(s.added_p99_ms, 3), "samples": len(s.added_ms)},
            "loaded_added_ms": {"median": round(_median(s.loaded_ms), 3),
                                "p99": round(_quantile(s.loaded_ms, 0.99), 3), "samples": len(s.loaded_ms)},
            "contended_windows": s.shares.windows,
            "tenants": {t: {"weight": TENANTS[t].weight, "reserved_tokens": s.shares.served[t],
                            "share": round(s.shares.share(t), 4), "fair_share": round(s.shares.fair_share(t), 4)}
                        for t in TENANTS}}
