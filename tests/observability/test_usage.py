"""The usage observer finds the backend's prompt length at the end of any response, however it was chunked."""

from __future__ import annotations

import orjson
import pytest

from gateway.observability.usage import TAIL_BYTES, UsageObserver

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


def _observe(content_type: str, body: bytes, chunk_bytes: int = 7) -> int | None:
    observer = UsageObserver()
    observer.begin(content_type)
    for start in range(0, len(body), chunk_bytes):
        observer.feed(body[start:start + chunk_bytes])
    return observer.prompt_tokens()


def _sse(*events: dict[str, object]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events)


def _ndjson(*lines: dict[str, object]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


@pytest.mark.parametrize(
    ("name", "content_type", "body", "expected"),
    [
        ("ollama /api/chat", "application/json",
         orjson.dumps({"message": {"content": "hi"}, "done": True, "prompt_eval_count": 2051, "eval_count": 3}), 2051),
        ("ollama /api/generate stream", "application/x-ndjson",
         _ndjson({"response": "a", "done": False},
                 {"response": "", "done": True, "prompt_eval_count": 2051, "context": [1, 2, 3]}), 2051),
        ("openai", "application/json",
         orjson.dumps({"choices": [], "usage": {"prompt_tokens": 2051, "completion_tokens": 3}}), 2051),
        ("openai stream with usage", "text/event-stream",
         _sse({"choices": [{"delta": {"content": "a"}}], "usage": None},
              {"choices": [], "usage": {"prompt_tokens": 2051, "prompt_tokens_details": {"cached_tokens": 2000}}})
         + b"data: [DONE]\n\n", 2051),
        ("openai stream without usage", "text/event-stream",
         _sse({"choices": [{"delta": {"content": "a"}}]}) + b"data: [DONE]\n\n", None),
        ("anthropic", "application/json",
         orjson.dumps({"type": "message", "usage": {"input_tokens": 51, "cache_read_input_tokens": 2000,
                                                    "output_tokens": 3}}), 2051),
        ("anthropic stream", "text/event-stream",
         b"event: message_start\n" + _sse({"type": "message_start", "message": {"usage": {"input_tokens": 2051}}})
         + b"event: message_delta\n" + _sse({"type": "message_delta", "usage": {"output_tokens": 9}})
         + b"event: message_stop\n" + _sse({"type": "message_stop"}), 2051),
        ("openai responses stream", "text/event-stream",
         _sse({"type": "response.output_text.delta", "delta": "a"},
              {"type": "response.completed", "response": {"usage": {"input_tokens": 2051, "output_tokens": 1}}}),
         2051),
        ("llama-server /completion", "application/json",
         orjson.dumps({"content": "a", "tokens_evaluated": 2051, "timings": {"cache_n": 2000, "prompt_n": 51}}),
         2051),
        ("llama-server /completion stream, timings only", "text/event-stream",
         _sse({"content": "a", "stop": False},
              {"content": "", "stop": True, "timings": {"cache_n": 2000, "prompt_n": 51, "predicted_n": 1}}), 2051),
        ("an error body", "application/json", b'{"error":"model not found"}', None),
    ],
)
def test_every_backend_shape(name: str, content_type: str, body: bytes, expected: int | None) -> None:
    assert _observe(content_type, body) == expected, name
    assert _observe(content_type, body, chunk_bytes=len(body) or 1) == expected, name


def test_a_plain_body_longer_than_the_tail_is_read_by_name() -> None:
    body = orjson.dumps({"choices": [{"message": {"content": "x" * (3 * TAIL_BYTES)}}],
                        "usage": {"prompt_tokens": 2051, "prompt_tokens_details": {"cached_tokens": 9}}})
    assert _observe("application/json", body, chunk_bytes=1 << 16) == 2051


def test_a_figure_inside_the_text_is_not_taken_for_one() -> None:
    body = orjson.dumps({"choices": [{"message": {"content": 'say "prompt_tokens": 5 ' + "x" * (2 * TAIL_BYTES)}}]})
    assert _observe("application/json", body, chunk_bytes=1 << 16) is None


def test_asking_twice_searches_once_until_more_comes() -> None:
    observer = UsageObserver()
    observer.begin("application/x-ndjson")
    observer.feed(b'{"done":true,"prompt_eval_count":5}\n')
    assert observer.prompt_tokens() == observer.prompt_tokens() == 5
    observer.feed(b'{"done":true,"prompt_eval_count":6}\n')
    assert observer.prompt_tokens() == 6


def _observe_output(content_type: str, body: bytes, chunk_bytes: int = 7) -> int | None:
    observer = UsageObserver()
    observer.begin(content_type)
    for start in range(0, len(body), chunk_bytes):
        observer.feed(body[start:start + chunk_bytes])
    return observer.output_tokens()


@pytest.mark.parametrize(
    ("name", "content_type", "body", "expected"),
    [
        ("ollama /api/chat", "application/json",
         orjson.dumps({"message": {"content": "hi"}, "done": True, "prompt_eval_count": 2051, "eval_count": 3}), 3),
        ("ollama /api/generate stream", "application/x-ndjson",
         _ndjson({"response": "a", "done": False},
                 {"response": "", "done": True, "prompt_eval_count": 2051, "eval_count": 17, "context": [1, 2]}), 17),
        ("ollama load request (no output)", "application/json",
         orjson.dumps({"model": "m", "created_at": "x", "response": "", "done": True, "done_reason": "load"}), None),
        ("openai", "application/json",
         orjson.dumps({"choices": [], "usage": {"prompt_tokens": 2051, "completion_tokens": 3}}), 3),
        ("openai stream with usage", "text/event-stream",
         _sse({"choices": [{"delta": {"content": "a"}}], "usage": None},
              {"choices": [], "usage": {"prompt_tokens": 2051, "completion_tokens": 12, "total_tokens": 2063}})
         + b"data: [DONE]\n\n", 12),
        ("openai stream without usage", "text/event-stream",
         _sse({"choices": [{"delta": {"content": "a"}}]}) + b"data: [DONE]\n\n", None),
        ("anthropic", "application/json",
         orjson.dumps({"type": "message", "usage": {"input_tokens": 51, "cache_read_input_tokens": 2000,
                                                    "output_tokens": 3}}), 3),
        ("anthropic stream: message_delta's final count, not message_start's", "text/event-stream",
         b"event: message_start\n"
         + _sse({"type": "message_start", "message": {"usage": {"input_tokens": 2051, "output_tokens": 1}}})
         + b"event: message_delta\n" + _sse({"type": "message_delta", "usage": {"output_tokens": 9}})
         + b"event: message_stop\n" + _sse({"type": "message_stop"}), 9),
        ("openai responses stream", "text/event-stream",
         _sse({"type": "response.output_text.delta", "delta": "a"},
              {"type": "response.completed", "response": {"usage": {"input_tokens": 2051, "output_tokens": 5}}}), 5),
        ("llama-server /completion", "application/json",
         orjson.dumps({"content": "a", "tokens_evaluated": 2051, "tokens_predicted": 8,
                       "timings": {"cache_n": 2000, "prompt_n": 51, "predicted_n": 8}}), 8),
        ("llama-server /completion stream, timings only", "text/event-stream",
         _sse({"content": "a", "stop": False},
              {"content": "", "stop": True, "timings": {"cache_n": 2000, "prompt_n": 51, "predicted_n": 4}}), 4),
        ("llama-server /v1/chat/completions", "application/json",
         orjson.dumps({"choices": [], "usage": {"completion_tokens": 6, "prompt_tokens": 2051, "total_tokens": 2057},
                       "timings": {"prompt_n": 51, "predicted_n": 6}}), 6),
        ("an error body", "application/json", b'{"error":"model not found"}', None),
    ],
)
def test_output_tokens_of_every_backend_shape(name: str, content_type: str, body: bytes, expected: int | None) -> None:
    assert _observe_output(content_type, body) == expected, name
    assert _observe_output(content_type, body, chunk_bytes=len(body) or 1) == expected, name


def test_prompt_and_output_are_searched_apart() -> None:
    observer = UsageObserver()
    observer.begin("application/x-ndjson")
    observer.feed(b'{"done":true,"prompt_eval_count":5,"eval_count":2}\n')
    assert (observer.prompt_tokens(), observer.output_tokens()) == (5, 2)
    observer.feed(b'{"done":true,"prompt_eval_count":6,"eval_count":3}\n')
    assert (observer.output_tokens(), observer.prompt_tokens()) == (3, 6)


def test_a_plain_body_longer_than_the_tail_has_its_output_read_by_name() -> None:
    body = orjson.dumps({"choices": [{"message": {"content": "x" * (3 * TAIL_BYTES)}}],
                        "usage": {"prompt_tokens": 2051, "completion_tokens": 77}})
    assert _observe_output("application/json", body, chunk_bytes=1 << 16) == 77
    text = orjson.dumps({"response": 'say "eval_count": 5 ' + "x" * (2 * TAIL_BYTES), "prompt_eval_count": 9})
    assert _observe_output("application/json", text, chunk_bytes=1 << 16) is None  # prompt_eval_count is no output
