"""Streams are recognised by their Content-Type."""

from __future__ import annotations

import pytest

from gateway.headers import NDJSON, SSE, stream_kind


@pytest.mark.parametrize(
    ("header", "kind"),
    [("application/x-ndjson", NDJSON), ("text/event-stream; charset=utf-8", SSE), ("application/json", None),
     ("", None)],
)
def test_stream_kind(header: str, kind: str | None) -> None:
    assert stream_kind(header) == kind
