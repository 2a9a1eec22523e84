"""Human-readable rendering of an Estimate (the `kvgate estimate` table)."""

from __future__ import annotations

from gateway.memory.fit_estimate import Estimate

KIB = 1024
MIB = KIB * 1024
GIB = MIB * 1024


def format_bytes(n_bytes: int | None) -> str:
    if n_bytes is None:
        return "unknown"
    sign = "-" if n_bytes < 0 else ""
    size = abs(n_bytes)
    if size >= GIB:
        return f"{sign}{size / GIB:.2f} GiB"
    if size >= MIB:
        return f"{sign}{size / MIB:.1f} MiB"
    if size >= KIB:
        return f"{sign}{size / KIB:.1f} KiB"
    return f"{sign}{size} B"


def _verdict(estimate: Estimate) -> str:
    if estimate.fits is None:
        return "unknown (no VRAM reading: pass --vram 24GiB)"
    if estimate.fits:
        return "fits"
    return f"DOES NOT FIT (short by {format_bytes(-(estimate.headroom_bytes or 0))})"


def render_table(estimate: Estimate) -> str:
    cost = estimate.cost
    layout = "unified pool" if estimate.unified else "split slots"
    quant = f", {estimate.quantization}" if estimate.quantization else ""
    sequences = "sequence" if estimate.parallel == 1 else "sequences"
    rows = [
        ("KV per token", format_bytes(estimate.kv_bytes_per_token)),
        ("weights", format_bytes(cost.weights_bytes)),
        ("KV cache", format_bytes(cost.kv_bytes)),
        ("compute", format_bytes(cost.compute_bytes) + " (estimate)"),
        ("output", format_bytes(cost.output_bytes)),
        ("overhead", format_bytes(cost.overhead_bytes)),
        ("total", format_bytes(cost.total_bytes)),
        ("VRAM total", format_bytes(estimate.vram_total_bytes)),
        ("VRAM free", format_bytes(estimate.vram_free_bytes)),
        ("headroom", format_bytes(estimate.headroom_bytes)),
        ("verdict", _verdict(estimate)),
    ]
    if estimate.max_context_tokens is not None:
        rows.append(("max context", f"{estimate.max_context_tokens:,} tokens at {estimate.parallel} {sequences}"))
    if estimate.max_parallel is not None:
        rows.append(("max parallel", f"{estimate.max_parallel} at {estimate.context_tokens:,} tokens each"))
    width = max(len(label) for label, _ in rows)
    lines = [
        f"{estimate.model} ({estimate.source}{quant})",
        f"{estimate.context_tokens:,} tokens x {estimate.parallel} {sequences}, "
        f"K {estimate.type_k} / V {estimate.type_v}, {layout}",
        "",
        *(f"  {label:<{width}}  {value}" for label, value in rows),
    ]
    lines += [f"warning: {w}" for w in estimate.warnings]
    return "\n".join(lines)
