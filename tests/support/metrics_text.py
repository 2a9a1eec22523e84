"""Read a sample sum out of a Prometheus text exposition (kvgate's /kvgate/metrics, llama-server's /metrics)."""

from __future__ import annotations

import re


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for found in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? ([0-9.e+-]+)$", text, re.MULTILINE):
        have = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1) or ""))
        if all(have.get(key) == value for key, value in labels.items()):
            total += float(found.group(2))
    return total
