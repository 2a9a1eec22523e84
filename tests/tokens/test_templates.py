"""Template detection and rendering, llama.cpp-style JSON, and the overhead estimator (pure functions)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from gateway.tokens.overhead import OverheadEstimator
from gateway.tokens.templates import TemplateError, detect_template, render
from gateway.tokens.tojson import llama_tojson

DAY = dt.date(2026, 1, 5)
LLAMA31 = (Path(__file__).parent / "data" / "llama-3.1-instruct.jinja").read_text(encoding="utf-8")
LLAMA3_BASIC = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    ("source", "family"),
    [(LLAMA31, "llama3.1"), (LLAMA3_BASIC, "llama3"), (None, "chatml"), ("", "chatml"), ("{{ x }}", None)],
)
def test_detect_template(source: str | None, family: str | None) -> None:
    assert detect_template(source) == family


def test_llama31_renders_system_block_and_trims() -> None:
    segments = render("llama3.1", [{"role": "user", "content": "  Hi \n"}], today=DAY)
    assert "".join(segments) == (
        "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 05 Jan 2026\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama31_tools_go_into_the_first_user_message() -> None:
    tool = {"type": "function", "function": {"name": "f", "strict": True}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1.0}'}}]},
        {"role": "tool", "content": "R"},
    ]
    text = "".join(render("llama3.1", messages, [tool], today=DAY))
    assert "Environment: ipython\n" in text
    assert '"description": "",\n        "parameters": {}' in text  # rebuilt like llama-server; "strict" dropped
    assert "strict" not in text
    assert '{"name": "f", "parameters": {"x": 1}}<|eot_id|>' in text
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"R"<|eot_id|>' in text


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"name": "a"}}] * 2}],
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": "b"},
        ],
        [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"name": "a"}}]}],
        [{"role": "user", "tool_calls": [{"function": {"name": "a", "arguments": "{not json"}}]}],
    ],
)
def test_llama31_rejects_what_the_server_rejects(messages: list[dict[str, Any]]) -> None:
    with pytest.raises(TemplateError):
        render("llama3.1", messages, today=DAY)


def test_final_assistant_message_is_a_prefill() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}] * 2},
    ]
    segments = render("chatml", messages, today=DAY)
    assert "".join(segments) == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na\n\na"


def test_chatml_and_basic_llama3_refuse_tools() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    for family in ("chatml", "llama3"):
        with pytest.raises(TemplateError, match="tool"):
            render(family, [{"role": "user", "content": "q"}], [tool], today=DAY)
    with pytest.raises(TemplateError, match="no renderer"):
        render("jinja-of-unknown-origin", [], today=DAY)


def test_developer_role_becomes_system_and_parts_join_with_newline() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "developer", "content": "D"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}],
        },
    ]
    text = "".join(render("llama3", messages, today=DAY))
    assert text.startswith("<|start_header_id|>system<|end_header_id|>\n\nD<|eot_id|>")
    assert "\n\na\nb<|eot_id|>" in text


@pytest.mark.parametrize(
    ("value", "indent", "expected"),
    [
        ({"a": 1, "b": [1, 2.5, 3.0], "c": None, "d": True}, None, '{"a": 1, "b": [1, 2.5, 3], "c": null, "d": true}'),
        ({"x": 1e20, "y": 0.1, "z": 1e-7}, None, '{"x": 1e+20, "y": 0.1, "z": 1e-07}'),
        ('é\n"\x01', None, '"é\\n\\"\\u0001"'),
        ({"a": [], "b": {}}, 2, '{\n  "a": [],\n  "b": {}\n}'),
        ([1, {"k": "v"}], 4, '[\n    1,\n    {\n        "k": "v"\n    }\n]'),
    ],
)
def test_llama_tojson(value: object, indent: int | None, expected: str) -> None:
    assert llama_tojson(value, indent=indent) == expected


def test_overhead_defaults_are_generous_until_samples_arrive() -> None:
    estimator = OverheadEstimator(default_per_message_tokens=10, default_per_request_tokens=64)
    assert estimator.current().tokens(3) == 94
    assert estimator.observe(2, 100, 113)  # one message count: keep 10 per message, intercept covers the sample
    assert estimator.current().tokens(2) == 13
    assert not estimator.current().exact


def test_overhead_fit_is_exact_for_a_linear_template() -> None:
    estimator = OverheadEstimator(exact_after=3)
    for n, content in ((1, 50), (3, 80), (5, 20), (2, 7)):
        estimator.observe(n, content, content + 5 * n + 3)
    overhead = estimator.current()
    assert (overhead.tokens(4), overhead.exact) == (23, True)


def test_overhead_never_predicts_below_a_sample_and_ignores_truncation() -> None:
    estimator = OverheadEstimator()
    for n, extra in ((1, 10), (2, 14), (3, 30)):
        estimator.observe(n, 100, 100 + extra)
    assert all(estimator.current().tokens(n) >= extra for n, extra in ((1, 10), (2, 14), (3, 30)))
    assert not estimator.observe(2, 500, 400)  # reported below the content: truncated by the backend
    assert estimator.samples == 3
