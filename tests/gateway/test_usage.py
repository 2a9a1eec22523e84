"""The usage observer finds the backend's prompt length at the end of any response, however it was chunked."""

from __future__ import annotations

import orjson
import pytest

from gateway.usage import TAIL_BYTES, UsageObserver

NDJSON_BODY = b'{"done":false}\n{"done":true,"prompt_eval_count":42}\n'
SSE_BODY = (b'data: {"choices":[{"delta":{}}]}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":42,"completion_tokens":3}}\n\n'
            b"data: [DONE]\n\n")
JSON_BODY = b'{"usage":{"prompt_tokens":42}}'


@pytest.mark.parametrize(("content_type", "body"), [("application/x-ndjson", NDJSON_BODY),
                                                    ("text/event-stream", SSE_BODY),
                                                    ("application/json", JSON_BODY)])
def test_every_split(content_type: str, body: bytes) -> None:
    for cut in range(len(body) + 1):
        observer = UsageObserver()
        observer.begin(content_type)
        observer.feed(body[:cut])
        observer.feed(body[cut:])
        assert observer.prompt_tokens() == 42, cut


def test_long_streams_keep_only_the_tail() -> None:
    observer = UsageObserver()
    observer.begin("application/x-ndjson")
    line = orjson.dumps({"done": False, "message": {"content": "x" * 1000}}) + b"\n"
    for _ in range(3 * TAIL_BYTES // len(line)):
        observer.feed(line)
    observer.feed(b'{"done":true,"prompt_eval_count":7,"context":[' + b"1," * 1000 + b'1]}\n')
    assert observer.prompt_tokens() == 7
    assert observer._tail_bytes < TAIL_BYTES + 10_000


def test_no_usage_is_none() -> None:
    observer = UsageObserver()
    observer.begin("text/event-stream")
    observer.feed(b"data: [DONE]\n\n")
    assert observer.prompt_tokens() is None


def test_a_figure_far_from_the_end_is_still_found() -> None:
    """Anthropic streams report input_tokens in their first event; many deltas may follow it."""
    observer = UsageObserver()
    observer.begin("text/event-stream")
    observer.feed(b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":9}}}\n\n')
    delta = b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"tok"}}\n\n'
    for _ in range(2000):  # about 150 KB in small chunks, far past the first look at the end
        observer.feed(delta)
    observer.feed(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert observer.prompt_tokens() == 9
