"""The status report: ``GET /kvgate/status`` as JSON (backends, KV pools, GPUs, truncations) or as a page, and
``GET /kvgate/tenants``; built from what the layers below hold, no I/O."""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gateway import __version__
from gateway.admission import PoolKey, PoolSpec, QueueStats, WaitingRoom
from gateway.admission.pool_slots import SlotSource
from gateway.backends import BackendRegistry
from gateway.observability.outcomes import OutcomeTally
from gateway.observability.pool_layout import pool_label
from gateway.observability.tenant_usage import TenantUsage
from gateway.support.safe_text import safe_text


def tenants_snapshot(usage: TenantUsage, configured: Iterable[str], room: WaitingRoom) -> dict[str, object]:
    """``GET /kvgate/tenants``: each tenant's usage since start (observability/tenant_usage.py) and the sequences it
    holds in the KV pools now; no I/O."""
    active: Counter[str] = Counter()
    ledger = room.ledger
    for key in ledger.keys():  # noqa: SIM118 (a Ledger is no mapping)
        active.update(ledger.snapshot(key).per_tenant_active)
    return usage.snapshot(configured, active)


def status_snapshot(
    registry: BackendRegistry, room: WaitingRoom, pools: dict[tuple[str, str], PoolSpec], uptime_s: float,
    truncations: dict[str, Any] | None = None, notes: dict[str, list[str]] | None = None,
    *, gpus: list[dict[str, Any]] | None = None, routing: Callable[[str], dict[str, Any]] | None = None,
    slot_sources: Mapping[tuple[str, str], SlotSource] | None = None,
    outcomes: OutcomeTally | None = None,
) -> dict[str, Any]:
    """Backends (with ``notes``: why one is forwarded without admission, a configured context its loaded models
    disagree with), their models, every KV pool with its reservations and queue, the GPU ledger of each backend with
    a VRAM source (``observability.gpus.gpu_rows``), and the silent truncations seen in replies
    (``TruncationLog.snapshot()``), as JSON; with ``routing`` (``Router.status``), each backend's routing state:
    seconds it stays out after failing, why, outages and retries; with ``slot_sources`` (``SlotBook.sources``), where
    each pool's slot count came from (configured, inferred from /api/ps, reported by /props, assumed). With
    ``outcomes``, each pool's requests by outcome since start and the totals of every request
    (``observability/outcomes.py``). Every string that may come from a client or a backend is safe text
    (``gateway.support.safe_text``), so the page always encodes."""
    notes = notes or {}
    stats = room.stats()
    tally = outcomes or OutcomeTally()
    keys = {*(PoolKey(*key) for key in pools), *room.ledger.keys(), *stats, *tally.keys()}
    sources = slot_sources or {}
    pool_rows = [{**_pool_row(room, key, pools.get(key), stats.get(key), tally),
                  "slots_source": _slots_source(sources.get(key))} for key in sorted(keys)]
    return {
        "version": __version__,
        "uptime_s": round(uptime_s, 1),
        "backends": [
            {"name": b.name, "kind": str(b.kind), "url": b.settings.shown_url,  # a password masked
             "models": sorted(map(safe_text, b.models)),
             "last_error": b.last_error and safe_text(b.last_error),
             "notes": [safe_text(note) for note in notes.get(b.name, [])],
             **({} if routing is None else {"routing": _routing_row(routing(b.name))})}
            for b in registry.backends
        ],
        "pools": pool_rows,
        "outcomes": tally.total.to_json(),
        "gpus": gpus or [],
        "truncations": truncations or {"counts": [], "recent": []},
    }


def _pool_row(room: WaitingRoom, key: PoolKey, spec: PoolSpec | None, stat: QueueStats | None,
              tally: OutcomeTally) -> dict[str, Any]:
    """One pool: its layout, what it holds on every replica (``scope`` "shared", with a shared ledger) and this
    replica's part of it (``local``; its own reservations are ``sequences``), its queue here, and its requests by
    outcome since start."""
    total, here = room.pool_snapshot(key), room.ledger.snapshot(key)
    queued_here = stat.queued if stat else 0
    return {
        "backend": safe_text(key.backend), "model": safe_text(key.model),
        "kind": "unified" if spec and spec.unified else "split" if spec else None,
        "layout": pool_label(spec) if spec else None,
        "slots": spec.slots if spec else None,
        "slot_context_tokens": spec.slot_ctx_tokens if spec else None,
        "capacity_tokens": spec.pool_tokens if spec else None,
        "scope": "local" if room.shared is None else "shared",
        "active_sequences": total.active_sequences,
        "reserved_tokens": total.reserved_tokens,
        "local": {"active_sequences": here.active_sequences, "reserved_tokens": here.reserved_tokens},
        "other_replicas": {"active_sequences": max(0, total.active_sequences - here.active_sequences),
                           "reserved_tokens": max(0, total.reserved_tokens - here.reserved_tokens),
                           "queued": max(0, room.queue_length(key) - queued_here)},
        "sequences": [{"id": r.id, "tenant": safe_text(r.tenant), "tokens": r.tokens, "sequences": r.sequences}
                      for r in room.ledger.reservations(key)],
        "queued": queued_here,
        "oldest_wait_s": round(stat.oldest_waited_s, 3) if stat else 0.0,
        "waiting": [{"position": position, "tenant": safe_text(w.tenant), "priority": w.priority,
                     "waited_s": round(w.waited_s, 3), "reason": safe_text(w.reason)}
                    for position, w in enumerate(stat.waiters if stat else (), start=1)],
        **tally.pool(key).to_json(),
    }


def _routing_row(state: dict[str, Any]) -> dict[str, Any]:
    reason = state.get("out_reason")
    return {**state, "out_reason": None if reason is None else safe_text(str(reason))}


def status_html(status: dict[str, Any]) -> str:
    """The same, as a page a person can read."""
    def cells(values: list[Any], tag: str = "td") -> str:
        return "".join(f"<{tag}>{html.escape(safe_text(str(v)))}</{tag}>" for v in values)

    pool_columns = ["backend", "model", "layout", "slots_source", "capacity_tokens", "active_sequences",
                    "reserved_tokens", "queued", "oldest_wait_s", "admitted_total", "queued_total", "clamped_total",
                    "pinned_total", "trimmed_total", "summarized_total", "summary_failed_total", "refused_total"]
    backend_columns = [[b["name"], b["kind"], b["url"], ", ".join(b["models"]), _out_cell(b.get("routing")),
                        b["last_error"] or "", "; ".join(b["notes"])] for b in status["backends"]]
    backend_rows = "".join(f"<tr>{cells(row)}</tr>" for row in backend_columns)
    pool_rows = "".join(f"<tr>{cells([_pool_cell(p, c) for c in pool_columns])}</tr>"
                        for p in status["pools"])
    gpu_columns = ["backend", "source", "total_bytes", "models", "other_processes_bytes", "reserved_bytes",
                   "free_bytes", "overcommitted", "problem"]
    gpu_rows = "".join(f"<tr>{cells([_gpu_cell(g, c) for c in gpu_columns])}</tr>" for g in status.get("gpus", []))
    truncations = status["truncations"]
    count_rows = "".join(f"<tr>{cells([c['backend'], c['model'], c['truncations']])}</tr>"
                         for c in truncations["counts"])
    event_columns = ["at", "request_id", "backend", "model", "counted_tokens", "reported_tokens"]
    event_rows = "".join(f"<tr>{cells([e[c] for c in event_columns])}</tr>" for e in truncations["recent"])
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>kvgate status</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}</style></head><body>"
        f"<h1>kvgate {html.escape(status['version'])}</h1><p>up {status['uptime_s']} s</p>"
        "<h2>Backends</h2><table>"
        f"<tr>{cells(['name', 'kind', 'url', 'models', 'routing', 'last error', 'notes'], 'th')}</tr>"
        f"{backend_rows}</table>"
        f"<h2>KV pools</h2><table><tr>{cells(pool_columns, 'th')}</tr>{pool_rows}</table>"
        f"<h2>GPUs</h2><table><tr>{cells(gpu_columns, 'th')}</tr>{gpu_rows}</table>"
        "<h2>Silent truncations</h2><p>replies whose reported prompt length is short of kvgate's count: the "
        "backend cut the prompt without saying so</p>"
        f"<table><tr>{cells(['backend', 'model', 'truncations'], 'th')}</tr>{count_rows}</table>"
        f"<h3>Latest</h3><table><tr>{cells(event_columns, 'th')}</tr>{event_rows}</table></body></html>"
    )


def _out_cell(routing: dict[str, Any] | None) -> str:
    """"out for 12.5 s (reason); 3 outages", "in; 1 outage", or "" without routing state."""
    if routing is None:
        return ""
    outages = f"{routing['outages']} outage{'' if routing['outages'] == 1 else 's'}"
    if routing.get("out_for_s") is None:
        return f"in; {outages}"
    return f"out for {routing['out_for_s']} s ({routing.get('out_reason') or ''}); {outages}"


def _pool_cell(pool: dict[str, Any], column: str) -> Any:
    """A pool's cell; its slots' source as "inferred: ...", the detail a person needs to check it."""
    if column == "slots_source":
        source = pool.get("slots_source")
        return "" if not source else f"{source['source']}: {source['detail']}"
    return "" if pool.get(column) is None else pool[column]


def _slots_source(source: SlotSource | None) -> dict[str, Any] | None:
    return None if source is None else {**source.to_json(), "detail": safe_text(source.detail)}


def _gpu_cell(gpu: dict[str, Any], column: str) -> Any:
    if column == "models":
        return ", ".join(f"{m['name']}: {m['resident_bytes']} ({m['source']})" for m in gpu.get("models", []))
    value = gpu.get(column)
    return "" if value is None else value
