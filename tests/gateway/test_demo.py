"""`kvgate demo`: the same workload straight at the simulator and through kvgate; kvgate prevents the failures."""

from __future__ import annotations

import io

from gateway.cli import build_parser
from gateway.demo_cli import run


async def test_demo_shows_kvgate_preventing_oom_truncation_and_reloads() -> None:
    out = io.StringIO()
    assert await run(build_parser().parse_args(["demo"]), out=out) == 0
    rows = {}
    for line in out.getvalue().splitlines():
        parts = line.rsplit(maxsplit=2)
        if len(parts) == 3 and parts[1].replace(".", "").isdigit():
            rows[parts[0].strip()] = (parts[1], parts[2])
    direct, gated = zip(*[(float(a), float(b)) for a, b in rows.values()], strict=True)
    table = dict(zip(rows, zip(direct, gated, strict=True), strict=True))
    assert table["failed: out of memory"][0] > 0 and table["failed: out of memory"][1] == 0
    assert table["silently truncated"][0] > 0 and table["silently truncated"][1] == 0
    assert table["model reloads"][0] > 0 and table["model reloads"][1] == 0
    assert table["completed"][1] == table["requests"][1]
