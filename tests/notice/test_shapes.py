"""The notice's pure parts, table by table: its words, which requests get none, where it goes in a whole reply and
in a stream of every framing, split at every byte, and never in a reply that only calls tools."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway import dialects
from gateway.admission.outcome import AdmissionOutcome, SummaryNote, Trim
from gateway.domain import Dialect, Operation
from gateway.notice import Notice, reply_notice
from gateway.notice.shapes import Shape, add_to_reply, withheld
from gateway.notice.stream import MAX_EVENT_BYTES, NoticeStream
from gateway.notice.words import notice_line
from gateway.support.hop_headers import NDJSON, SSE
from gateway.tokens import TokenCount

LINE = "[kvgate: 2 older messages were left out to fit the 8,192-token context]\n\n"
COUNT = TokenCount(9000, "gguf", True)


@pytest.mark.parametrize(("outcome", "said"), [
    (AdmissionOutcome(COUNT, trim=Trim(10, 41, 9214, 7020)), "10 older messages were left out"),
    (AdmissionOutcome(COUNT, trim=Trim(1, 3, 9214, 7020)), "1 older message was left out"),
    (AdmissionOutcome(COUNT, trim=Trim(0, 0, 9214, 7020, text="kept 12 of 40 KB")),
     "the middle of the prompt was left out"),
    (AdmissionOutcome(COUNT, trim=Trim(0, 1, 9214, 7020, text="kept its head and tail")),
     "part of a long message was left out"),
    (AdmissionOutcome(COUNT, trim=Trim(4, 9, 9214, 7020, reason="summary failed: x", summary_failure="error")),
     "4 older messages were left out"),
    (AdmissionOutcome(COUNT, summary=SummaryNote(10, 14, 2167, 634, cached=True)),
     "10 older messages were replaced by a summary"),
])
def test_the_line_says_what_was_left_out(outcome: AdmissionOutcome, said: str) -> None:
    assert notice_line(outcome, 8192) == f"[kvgate: {said} to fit the 8,192-token context]\n\n"


def test_nothing_changed_no_line() -> None:
    assert notice_line(AdmissionOutcome(COUNT, rewrites=("max_tokens=10 (was 99)",)), 8192) is None


def _parsed(dialect: Dialect, operation: Operation, body: dict[str, Any]) -> Any:
    base = {"model": "m"} | ({"messages": [{"role": "user", "content": "x"}]} if operation is not Operation.GENERATE
                             and dialect is not Dialect.LLAMACPP else {"prompt": "x"})
    if operation is Operation.RESPONSES:
        base = {"model": "m", "input": "x"}
    if operation is Operation.INFILL:
        base = {"input_prefix": "a", "input_suffix": "b"}
    return dialects.parse(dialect, operation, {**base, **body}, "")


@pytest.mark.parametrize(("dialect", "operation", "body", "why"), [
    (Dialect.OLLAMA, Operation.CHAT, {}, None),
    (Dialect.OLLAMA, Operation.CHAT, {"format": "json"}, "structured"),
    (Dialect.OLLAMA, Operation.CHAT, {"format": {"type": "object"}}, "structured"),
    (Dialect.OLLAMA, Operation.GENERATE, {"suffix": "}"}, "fill-in-the-middle"),
    (Dialect.OLLAMA, Operation.GENERATE, {"raw": True}, "raw"),
    (Dialect.OPENAI, Operation.CHAT, {"response_format": {"type": "text"}}, None),
    (Dialect.OPENAI, Operation.CHAT, {"response_format": {"type": "json_object"}}, "structured"),
    (Dialect.OPENAI, Operation.CHAT, {"response_format": {"type": "json_schema", "json_schema": {}}}, "structured"),
    (Dialect.OPENAI, Operation.GENERATE, {"suffix": "x"}, "fill-in-the-middle"),
    (Dialect.OPENAI, Operation.RESPONSES, {"text": {"format": {"type": "text"}}}, None),
    (Dialect.OPENAI, Operation.RESPONSES, {"text": {"format": {"type": "json_schema"}}}, "structured"),
    (Dialect.ANTHROPIC, Operation.CHAT, {"max_tokens": 9}, None),
    (Dialect.ANTHROPIC, Operation.CHAT, {"max_tokens": 9, "output_format": {"type": "json_schema"}}, "structured"),
    (Dialect.LLAMACPP, Operation.GENERATE, {"grammar": "root ::= x"}, "structured"),
    (Dialect.LLAMACPP, Operation.GENERATE, {"json_schema": {}}, "structured"),
    (Dialect.LLAMACPP, Operation.INFILL, {}, "fill-in-the-middle"),
])
def test_replies_a_program_parses_get_no_notice(dialect: Dialect, operation: Operation, body: dict[str, Any],
                                                why: str | None) -> None:
    parsed = _parsed(dialect, operation, body)
    said = withheld(parsed)
    assert (said is None) if why is None else (said is not None and why in said), said
    trimmed = AdmissionOutcome(COUNT, trim=Trim(2, 5, 9000, 7000))
    notice = reply_notice(parsed, trimmed, 8192, enabled=True)
    assert (notice is not None) == (why is None and operation is not Operation.INFILL)
    assert reply_notice(parsed, trimmed, 8192, enabled=False) is None  # off by default, off means off


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
WHOLE: list[tuple[Shape, Any, Any]] = [  # (shape, reply, what it becomes; None: no notice)
    (Shape.OLLAMA_CHAT, {"message": {"role": "assistant", "content": "Hi"}, "done": True},
     {"message": {"role": "assistant", "content": LINE + "Hi"}, "done": True}),
    (Shape.OLLAMA_CHAT, {"message": {"role": "assistant", "content": "", "tool_calls": [CALL]}, "done": True}, None),
    (Shape.OLLAMA_GENERATE, {"response": "Hi", "done": True, "context": [1, 2]},
     {"response": LINE + "Hi", "done": True, "context": [1, 2]}),
    (Shape.OPENAI_CHAT, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}},
                                     {"index": 1, "message": {"role": "assistant", "content": "Yo"}}]},
     {"choices": [{"index": 0, "message": {"role": "assistant", "content": LINE + "Hi"}},
                  {"index": 1, "message": {"role": "assistant", "content": LINE + "Yo"}}]}),
    (Shape.OPENAI_CHAT, {"choices": [{"index": 0, "message": {"role": "assistant", "content": None,
                                                             "tool_calls": [CALL]}}]}, None),
    (Shape.OPENAI_COMPLETION, {"choices": [{"index": 0, "text": "Hi"}]},
     {"choices": [{"index": 0, "text": LINE + "Hi"}]}),
    (Shape.RESPONSES, {"output": [{"type": "reasoning", "id": "r"}, {"type": "message", "id": "m", "content": [
        {"type": "output_text", "text": "Hi"}]}]},
     {"output": [{"type": "reasoning", "id": "r"}, {"type": "message", "id": "m", "content": [
         {"type": "output_text", "text": LINE + "Hi"}]}]}),
    (Shape.RESPONSES, {"output": [{"type": "function_call", "id": "fc", "name": "f", "arguments": "{}"}]}, None),
    (Shape.ANTHROPIC, {"content": [{"type": "text", "text": "Hi"}, {"type": "tool_use", "id": "t"}]},
     {"content": [{"type": "text", "text": LINE + "Hi"}, {"type": "tool_use", "id": "t"}]}),
    (Shape.ANTHROPIC, {"content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}, None),
    (Shape.LLAMA_COMPLETION, {"content": "Hi", "tokens_predicted": 1}, {"content": LINE + "Hi", "tokens_predicted": 1}),
    (Shape.LLAMA_COMPLETION, [{"content": "a"}, {"content": "b"}], [{"content": LINE + "a"}, {"content": LINE + "b"}]),
    (Shape.LLAMA_COMPLETION, {"content": ""}, None),
]


@pytest.mark.parametrize(("shape", "reply", "becomes"), WHOLE)
def test_a_whole_reply_gets_the_line_in_front_of_its_text_only(shape: Shape, reply: Any, becomes: Any) -> None:
    raw = orjson.dumps(reply)
    rewritten = Notice(shape, LINE).rewrite_body(raw)
    if becomes is None:
        assert rewritten is None
    else:
        assert rewritten is not None and orjson.loads(rewritten) == becomes
    copy = orjson.loads(raw)
    assert add_to_reply(shape, copy, LINE) is (becomes is not None)


def _ndjson(*lines: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def _sse(*events: tuple[str | None, Any]) -> bytes:
    return b"".join((b"" if kind is None else f"event: {kind}\n".encode()) + b"data: "
                    + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n" for kind, data in events)


def _chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


OLLAMA_CHAT = [{"model": "m", "created_at": "t", "message": {"role": "assistant", "content": "", "thinking": "hm"},
                "done": False},
               {"model": "m", "created_at": "t", "message": {"role": "assistant", "content": "Hi"}, "done": False},
               {"model": "m", "created_at": "t", "message": {"role": "assistant", "content": ""}, "done": True,
                "eval_count": 2, "prompt_eval_count": 7}]
RESPONSES = [
    ("response.created", {"type": "response.created", "response": {"id": "r", "output": []}}),
    ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                    "item": {"id": "m1", "type": "message", "content": []}}),
    ("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "m1", "output_index": 0,
                                    "content_index": 0, "delta": "Hi", "sequence_number": 3}),
    ("response.output_text.done", {"type": "response.output_text.done", "item_id": "m1", "output_index": 0,
                                   "content_index": 0, "text": "Hi"}),
    ("response.content_part.done", {"type": "response.content_part.done", "item_id": "m1", "output_index": 0,
                                    "content_index": 0, "part": {"type": "output_text", "text": "Hi"}}),
    ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": {
        "id": "m1", "type": "message", "content": [{"type": "output_text", "text": "Hi"}]}}),
    ("response.completed", {"type": "response.completed", "response": {"id": "r", "output": [{
        "id": "m1", "type": "message", "content": [{"type": "output_text", "text": "Hi"}]}],
        "usage": {"input_tokens": 7, "output_tokens": 2}}}),
]
STREAMS: list[tuple[str, Shape, str, bytes, int, int]] = [  # (name, shape, framing, stream, choices, lines added)
    ("ollama chat, thinking first", Shape.OLLAMA_CHAT, NDJSON, _ndjson(*OLLAMA_CHAT), 1, 1),
    ("ollama chat, tool call only", Shape.OLLAMA_CHAT, NDJSON, _ndjson(
        {"model": "m", "message": {"role": "assistant", "content": "", "tool_calls": [CALL]}, "done": False},
        {"model": "m", "message": {"role": "assistant", "content": ""}, "done": True}), 1, 0),
    ("ollama generate", Shape.OLLAMA_GENERATE, NDJSON, _ndjson(
        {"model": "m", "response": "Hi", "done": False}, {"model": "m", "response": "", "done": True}), 1, 1),
    ("openai chat", Shape.OPENAI_CHAT, SSE, _sse(
        (None, _chunk({"role": "assistant", "content": ""})), (None, _chunk({"content": "Hi"})),
        (None, _chunk({}, "stop")), (None, b"[DONE]")), 1, 1),
    ("openai chat, tool call only", Shape.OPENAI_CHAT, SSE, _sse(
        (None, _chunk({"role": "assistant", "content": None})), (None, _chunk({"tool_calls": [{**CALL, "index": 0}]})),
        (None, _chunk({}, "tool_calls")), (None, b"[DONE]")), 1, 0),
    ("openai chat, n=2", Shape.OPENAI_CHAT, SSE, _sse(
        (None, _chunk({"content": "a"})), (None, _chunk({"content": "b"}, index=1)),
        (None, _chunk({"content": "c"})), (None, b"[DONE]")), 2, 2),
    ("openai completion", Shape.OPENAI_COMPLETION, SSE, _sse(
        (None, {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "Hi", "logprobs": None,
                                                                      "finish_reason": None}]}),
        (None, b"[DONE]")), 1, 1),
    ("anthropic", Shape.ANTHROPIC, SSE, _sse(
        ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 7}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "Hi"}}),
        ("message_stop", {"type": "message_stop"})), 1, 1),
    ("anthropic, tool use only", Shape.ANTHROPIC, SSE, _sse(
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "input_json_delta", "partial_json": "{}"}})), 1, 0),
    ("llama-server /completion", Shape.LLAMA_COMPLETION, SSE, _sse(
        (None, {"index": 0, "content": "Hi", "tokens": [9], "stop": False, "id_slot": 0, "tokens_predicted": 1}),
        (None, {"index": 0, "content": "", "stop": True, "timings": {"predicted_n": 1}})), 1, 1),
    ("responses", Shape.RESPONSES, SSE, _sse(*RESPONSES), 1, 1),
    ("openai chat, CRLF and pings", Shape.OPENAI_CHAT, SSE, b": ping\r\n\r\n" + _sse(
        (None, _chunk({"content": "Hi"}))).replace(b"\n", b"\r\n"), 1, 1),
]


def _run(shape: Shape, framing: str, stream: bytes, choices: int, cuts: list[int]) -> bytes:
    rewriter = NoticeStream(shape, LINE, framing, choices)
    out = b""
    last = 0
    for cut in [*cuts, len(stream)]:
        out += rewriter.feed(stream[last:cut])
        last = cut
    return out + rewriter.end()


@pytest.mark.parametrize(("name", "shape", "framing", "stream", "choices", "added"), STREAMS,
                         ids=[s[0] for s in STREAMS])
def test_a_stream_gets_one_event_before_its_first_text_at_every_split(
    name: str, shape: Shape, framing: str, stream: bytes, choices: int, added: int,
) -> None:
    whole = _run(shape, framing, stream, choices, [])
    for cut in range(1, len(stream)):  # every split in two, and one byte at a time
        assert _run(shape, framing, stream, choices, [cut]) == whole, (name, cut)
    assert _run(shape, framing, stream, choices, list(range(1, len(stream)))) == whole
    escaped = orjson.dumps(LINE)[1:-1]
    assert whole.count(escaped) == added + (4 if shape is Shape.RESPONSES else 0), whole
    if added == 0:
        assert whole == stream  # a reply with no text: its bytes, untouched
    elif shape is not Shape.RESPONSES:
        separator = b"\n" if framing == NDJSON else b"\n\n"
        frames = [f for f in whole.replace(b"\r\n", b"\n").split(separator) if f]
        kept = [f for f in frames if escaped not in f]
        original = [f for f in stream.replace(b"\r\n", b"\n").split(separator) if f]
        assert kept == original  # the backend's events, each as it was, in order
        first_text = next(i for i, f in enumerate(frames) if escaped in f)
        assert escaped not in b"".join(frames[:first_text])


def test_the_responses_closing_events_repeat_the_text_with_the_line() -> None:
    out = _run(Shape.RESPONSES, SSE, _sse(*RESPONSES), 1, [])
    events = [orjson.loads(line[6:]) for line in out.splitlines() if line.startswith(b"data: ")]
    texts = [e.get("delta") or e.get("text") or (e.get("part") or {}).get("text") for e in events]
    assert texts[2:4] == [LINE, "Hi"] and texts[4] == texts[5] == LINE + "Hi"
    assert events[6]["item"]["content"][0]["text"] == LINE + "Hi"
    assert events[7]["response"]["output"][0]["content"][0]["text"] == LINE + "Hi"
    assert events[7]["response"]["usage"] == {"input_tokens": 7, "output_tokens": 2}  # the backend's usage
    assert events[2]["sequence_number"] == events[3]["sequence_number"]


def test_the_inserted_event_carries_no_usage_or_timings() -> None:
    stream = _sse((None, {**_chunk({"content": "Hi"}), "usage": {"completion_tokens": 1}, "timings": {"n": 1}}))
    inserted = _run(Shape.OPENAI_CHAT, SSE, stream, 1, []).split(b"\n\n")[0]
    event = orjson.loads(inserted.removeprefix(b"data: "))
    assert "usage" not in event and "timings" not in event
    assert event["choices"] == [{"index": 0, "delta": {"content": LINE}, "finish_reason": None}]


def test_a_stream_cut_mid_event_gives_back_what_it_held() -> None:
    rewriter = NoticeStream(Shape.OPENAI_CHAT, LINE, SSE)
    assert rewriter.feed(b'data: {"choices": [{"ind') == b""
    assert rewriter.end() == b'data: {"choices": [{"ind'
    assert Notice(Shape.OLLAMA_CHAT, LINE).stream(SSE) is None  # an Ollama route answered in SSE: left alone


def test_what_a_stream_holds_stays_bounded_and_odd_fields_do_not_break_it() -> None:
    """A backend that never ends its first event: past MAX_EVENT_BYTES the rest passes as it comes, unread. A
    Responses event with a content index that is no number is read as part 0, not a crash."""
    rewriter = NoticeStream(Shape.OLLAMA_CHAT, LINE, NDJSON)
    big = b'{"message": {"content": "' + b"x" * MAX_EVENT_BYTES
    assert rewriter.feed(big[:100]) == b""
    assert rewriter.feed(big[100:]) == big  # what it held, and the rest, as they came
    assert rewriter.feed(b'"}}\n') == b'"}}\n'  # passing through now
    odd = _sse(("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "m",
                                               "content_index": "zero", "delta": "Hi"}))
    assert orjson.dumps(LINE)[1:-1] in _run(Shape.RESPONSES, SSE, odd, 1, [])
