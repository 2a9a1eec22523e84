"""NDJSON and SSE framers find the same frames whatever way the bytes are split."""

from __future__ import annotations

import pytest

from gateway.framing import NDJSON, SSE, NdjsonFramer, SseEvent, SseFramer, stream_kind

NDJSON_PAYLOAD = b'{"a":1}\n{"b":"x\\ny"}\r\n\n{"done":true}'
SSE_PAYLOAD = (
    b"data: {\"a\":1}\n\n"
    b":\n\n"
    b"event: error\r\ndata: {\"error\":1}\r\n\r\n"
    b"data: line1\ndata: line2\n\n"
    b"data: [DONE]\n\n"
)
SSE_EXPECTED = [
    SseEvent("", b'{"a":1}'),
    SseEvent("error", b'{"error":1}'),
    SseEvent("", b"line1\nline2"),
    SseEvent("", b"[DONE]"),
]


def _splits(payload: bytes) -> list[list[bytes]]:
    """Every way to cut the payload in two or three pieces."""
    cuts = [[payload]]
    for i in range(len(payload) + 1):
        cuts.append([payload[:i], payload[i:]])
        for j in range(i, len(payload) + 1, 7):
            cuts.append([payload[:i], payload[i:j], payload[j:]])
    return cuts


def test_ndjson_every_split() -> None:
    for pieces in _splits(NDJSON_PAYLOAD):
        framer = NdjsonFramer()
        lines = [line for piece in pieces for line in framer.feed(piece)] + framer.close()
        assert lines == [b'{"a":1}', b'{"b":"x\\ny"}', b'{"done":true}'], pieces


def test_sse_every_split() -> None:
    for pieces in _splits(SSE_PAYLOAD):
        framer = SseFramer()
        events = [event for piece in pieces for event in framer.feed(piece)] + framer.close()
        assert events == SSE_EXPECTED, pieces


def test_sse_byte_by_byte() -> None:
    framer = SseFramer()
    events = [event for byte in SSE_PAYLOAD for event in framer.feed(bytes([byte]))] + framer.close()
    assert events == SSE_EXPECTED


@pytest.mark.parametrize(
    ("header", "kind"),
    [("application/x-ndjson", NDJSON), ("text/event-stream; charset=utf-8", SSE), ("application/json", None),
     ("", None)],
)
def test_stream_kind(header: str, kind: str | None) -> None:
    assert stream_kind(header) == kind
