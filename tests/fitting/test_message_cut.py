"""A chat whose one message alone is past the context (gateway/fitting/message_cut.py, chat_fit.py): its middle is
omitted around a marker, whatever shape its content has, and the rest of the chat is left as sent."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.domain import Operation
from gateway.fitting.chat_fit import trim_chat
from gateway.fitting.head_tail import omission_marker
from gateway.fitting.message_cut import cut_longest_message, text_length, with_head_and_tail

MARKER = "characters omitted by kvgate"


def chars_of(value: Any) -> int:
    """A counter of a chat: one token per 10 characters of its JSON-ish text (strings only), plus 5 per item."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(chars_of(v) for v in value.values())
    if isinstance(value, list):
        return sum(chars_of(v) for v in value)
    return 0


async def count_messages(messages: list[dict[str, Any]]) -> int:
    return chars_of(messages) // 10 + 5 * len(messages)


async def count_body(body: dict[str, Any]) -> int:
    return chars_of({k: v for k, v in body.items() if k != "model"}) // 10 + 5


PASTE = "".join(f"line {i:05d} of the pasted log\n" for i in range(4000))  # 112,000 characters


def _text(message: dict[str, Any]) -> str:
    content = message.get("content", message.get("output"))
    if isinstance(content, str):
        return content
    assert isinstance(content, list)
    return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


CASES: list[tuple[str, Operation, dict[str, Any]]] = [
    ("aider summarizer: system + one user string", Operation.CHAT, {"messages": [
        {"role": "system", "content": "Summarize the chat."}, {"role": "user", "content": PASTE}]}),
    ("one user message, no system", Operation.CHAT, {"messages": [{"role": "user", "content": PASTE}]}),
    ("OpenAI text parts with an image between", Operation.CHAT, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": PASTE[:50_000]}, {"type": "image_url", "image_url": {"url": "data:,x"}},
        {"type": "text", "text": PASTE[50_000:]}]}]}),
    ("Anthropic blocks, system as its own field", Operation.CHAT, {"system": "Be brief.", "messages": [
        {"role": "user", "content": [{"type": "text", "text": PASTE}]}]}),
    ("older turns dropped first", Operation.CHAT, {"messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}, {"role": "assistant",
                                                                               "content": "hello"},
        {"role": "user", "content": PASTE}]}),
    ("a tool result is the long one", Operation.CHAT, {"messages": [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                              "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": PASTE}]}),
    ("Responses input as a string", Operation.RESPONSES, {"instructions": "Summarize.", "input": PASTE}),
    ("Responses input items", Operation.RESPONSES, {"input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "earlier"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PASTE}]}]}),
    ("Responses function_call_output", Operation.RESPONSES, {"input": [
        {"type": "message", "role": "user", "content": "read it"},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": PASTE}]}),
]
TARGET_TOKENS = 2000


@pytest.mark.parametrize(("name", "operation", "body"), CASES, ids=[c[0] for c in CASES])
async def test_a_message_past_the_context_keeps_its_head_and_tail(
    name: str, operation: Operation, body: dict[str, Any]
) -> None:
    before = await count_body(body)
    trimmed = await trim_chat(operation, body, count_body, TARGET_TOKENS)
    assert trimmed is not None, name
    assert trimmed.prompt_tokens == await count_body(trimmed.body) <= TARGET_TOKENS < before
    key = "input" if operation is Operation.RESPONSES else "messages"
    assert {k: v for k, v in trimmed.body.items() if k != key} == {k: v for k, v in body.items() if k != key}
    sent = trimmed.body[key]
    if isinstance(body[key], str):
        assert isinstance(sent, str) and MARKER in sent
        text = sent
    else:
        assert trimmed.cut is not None
        cut = sent[trimmed.cut.index]
        text = _text(cut)
        assert all(m in body[key] for i, m in enumerate(sent) if i != trimmed.cut.index)  # the rest as sent
        kinds = [p.get("type") for p in cut["content"] if isinstance(p, dict)] if isinstance(
            cut.get("content"), list) else []
        original = body[key][trimmed.cut_position - 1]
        if isinstance(original.get("content"), list):  # non-text parts kept, in place
            assert [k for k in kinds if k not in ("text", "input_text")] == [
                p["type"] for p in original["content"] if p["type"] not in ("text", "input_text")]
    assert text.startswith("line 00000 of the pasted log") and text.endswith("line 03999 of the pasted log\n")
    assert MARKER in text
    header = trimmed.describe(before)
    assert f"prompt {before:,} -> {trimmed.prompt_tokens:,} tokens" in header
    if not isinstance(body[key], str):
        assert f"cut message {trimmed.cut_position} of {len(body[key])}" in header and "omitted" in header
    print(f"\n{name:45s} {header}")


async def test_the_largest_head_and_tail_that_fits_is_kept() -> None:
    messages = [{"role": "user", "content": PASTE}]
    cut = await cut_longest_message(messages, count_messages, TARGET_TOKENS)
    assert cut is not None and cut.prompt_tokens <= TARGET_TOKENS
    one_more = [with_head_and_tail(messages[0], cut.kept_chars // 2 + 1)]
    assert await count_messages(one_more) > TARGET_TOKENS  # a character more each side would not fit
    assert cut.kept_chars + cut.omitted_chars == len(PASTE)


@pytest.mark.parametrize(("name", "messages"), [
    ("only the system prompt is long", [{"role": "system", "content": PASTE}, {"role": "user", "content": "hi"}]),
    ("developer message is never cut", [{"role": "developer", "content": PASTE}, {"role": "user", "content": "x"}]),
    ("no text at all", [{"role": "user", "content": None}, {"role": "user", "content": [{"type": "image_url"}]}]),
    ("not objects", ["a string", 42, None]),
])
async def test_instructions_and_textless_messages_are_never_cut(name: str, messages: list[Any]) -> None:
    """A chat whose system prompt alone is past the context can't be fitted (it is refused, as before): the
    instructions are the client's, never cut, and nothing else can make room."""
    assert await trim_chat(Operation.CHAT, {"messages": messages}, count_body, 3) is None, name


async def test_hostile_parts_are_passed_through() -> None:
    """Parts kvgate does not know (or that are not objects) stay as sent; text parts with a wrong type of text are
    not text; surrogate pairs and combining marks are never split (Python strings index code points)."""
    emoji = "👩‍💻é" * 20_000
    content = ["bare string", {"type": "text", "text": 5}, {"type": "custom", "text": "x" * 10}, {"type": "text",
                                                                                                 "text": emoji}]
    message = {"role": "user", "content": content}
    assert text_length(message) == len(emoji)
    cut = await cut_longest_message([message], count_messages, 1000)
    assert cut is not None
    sent = cut.messages[0]["content"]
    assert sent[:3] == content[:3] and MARKER in sent[3]["text"]
    sent[3]["text"].encode("utf-8")  # still valid text


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.text(min_size=0, max_size=300), min_size=1, max_size=6),
    st.integers(min_value=1, max_value=200),
)
def test_any_part_list_is_cut_to_a_head_and_a_tail(texts: list[str], half: int) -> None:
    content = [{"type": "text", "text": t} for t in texts]
    total = sum(len(t) for t in texts)
    if total < 2:
        return
    half = min(half, (total - 1) // 2)
    cut = with_head_and_tail({"role": "user", "content": content}, half)["content"]
    joined = "".join(p["text"] for p in cut)
    whole = "".join(texts)
    assert joined == whole[:half] + omission_marker(total - 2 * half) + whole[total - half:]
    assert all(p["text"] for p in cut)  # no empty parts left behind
