"""A load decision as a routing preview (gateway/loads/preview.py), table-driven."""

from __future__ import annotations

import pytest

from gateway.loads.plan import LoadAction, LoadDecision
from gateway.loads.preview import LoadPreview, PreviewVerdict, preview_of

GIB = 1 << 30


def decision(action: LoadAction, **more: object) -> LoadDecision:
    return LoadDecision(action, "m", 8192, 5 * GIB, 10 * GIB, **more)  # type: ignore[arg-type]


CASES = [
    ("fits", decision(LoadAction.LOAD), LoadPreview(PreviewVerdict.FITS)),
    ("fits lowered", decision(LoadAction.LOAD, lowered_from=32768), LoadPreview(PreviewVerdict.FITS, lowered_to=8192)),
    ("evicts", decision(LoadAction.LOAD, unload=("x", "y"), freed_bytes=7 * GIB),
     LoadPreview(PreviewVerdict.EVICTS, ("x", "y"), 7 * GIB)),
    ("waits", decision(LoadAction.WAIT, reason="busy"), LoadPreview(PreviewVerdict.CANNOT)),
    ("refused", decision(LoadAction.REFUSE, reason="too big"), LoadPreview(PreviewVerdict.CANNOT)),
    ("spills to the CPU", decision(LoadAction.LOAD, offloaded_ram_bytes=GIB), LoadPreview(PreviewVerdict.CANNOT)),
]


@pytest.mark.parametrize(("name", "given", "expected"), CASES, ids=[case[0] for case in CASES])
def test_preview_of(name: str, given: LoadDecision, expected: LoadPreview) -> None:
    got = preview_of(given)
    assert (got.verdict, got.evict_models, got.evict_bytes, got.lowered_to) == \
        (expected.verdict, expected.evict_models, expected.evict_bytes, expected.lowered_to)
    assert got.reason
