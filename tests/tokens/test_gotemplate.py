"""The Go-template interpreter, table-driven: text/template semantics and Ollama's data and functions."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gateway.tokens.gotemplate import OllamaTemplate, TemplateError
from kvsim.ollama.go_templates import GO_TEMPLATES

TODAY = dt.date(2025, 6, 1)
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("a  {{- .Messages | len -}}  b", "a1b"),
        ("{{/* c */}}x{{- /* c */ -}} y", "xy"),
        ('{{ if eq 1 2 }}a{{ else if eq "x" "x" }}b{{ else }}c{{ end }}{{ .Messages | len }}', "b1"),
        ("{{ range $i, $m := .Messages }}{{ $i }}:{{ $m.Role }}{{ end }}", "0:user"),
        ("{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ $y := 3 }}{{ end }}{{ $x }}{{ .Messages | len }}", "21"),
        ("{{ with .System }}S{{ else }}none{{ end }}{{ len .Messages }}", "none1"),
        ("{{ and 1 0 }} {{ or 0 \"\" 3 }} {{ not .Tools }} {{ len .Messages }}", "0 3 true 1"),
        ('{{ printf "%s-%d" "a" 5 }}{{ print 1 2 "x" 3 }}{{ index .Messages 0 | len }}', None),
        ("{{ range .Messages }}{{ .Content }}{{ break }}{{ end }}{{ slice \"héllo\" 0 1 }}", "hih"),
        ("{{ .Missing }}{{ if .Missing }}x{{ end }}{{ len .Messages }}", "<no value>1"),
        ('{{ json "<&>" }}{{ len .Messages }}', '"\\u003c\\u0026\\u003e"1'),
    ],
)
def test_template_semantics(source: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(TemplateError):  # index of a struct pointer: not reproduced, so the caller falls back
            OllamaTemplate(source).render(USER, today=TODAY)
        return
    assert OllamaTemplate(source).render(USER, today=TODAY).text == expected


def test_tool_calls_print_arguments_as_sorted_go_json() -> None:
    chat: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get", "arguments": {"unit": "c", "city": "Zürich <1>", "n": 3.0}}}]},
        {"role": "tool", "content": "20"},
    ]
    text = OllamaTemplate(GO_TEMPLATES["llama3"]).render(chat, today=TODAY).text
    assert '{"name": "get", "parameters": {"city":"Zürich \\u003c1\\u003e","n":3,"unit":"c"}}' in text
    assert text.endswith("<|start_header_id|>ipython<|end_header_id|>\n\n20<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_tools_render_as_ollama_template_tool_json_and_are_not_called_exact() -> None:
    tool = {"type": "function", "function": {"name": "get", "description": "Get it", "parameters": {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string", "description": "City", "default": "x"}}}}}
    rendered = OllamaTemplate(GO_TEMPLATES["llama3"]).render(USER, [tool], today=TODAY)
    assert ('{"type":"function","function":{"name":"get","description":"Get it","parameters":{"type":"object",'
            '"required":["city"],"properties":{"city":{"type":"string","description":"City"}}}}}') in rendered.text
    assert not rendered.exact
    with pytest.raises(TemplateError):  # qwen2.5 prints a struct without String(): not reproduced
        OllamaTemplate(GO_TEMPLATES["qwen2"]).render(USER, [tool], today=TODAY)


def test_legacy_template_runs_per_turn_and_cuts_after_the_last_response() -> None:
    template = OllamaTemplate("{{ if .System }}S:{{ .System }};{{ end }}U:{{ .Prompt }};A:{{ .Response }};END")
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
            {"role": "assistant", "content": "pre"}]
    assert template.render(chat, today=TODAY).text == "S:s;U:u1;A:a1;ENDU:u2;A:pre"


@pytest.mark.parametrize("source", ["{{ define \"x\" }}{{ end }}", "{{ if }}", "{{ .A", "{{ end }}",
                                    "{{ range .Messages }}", "{{ .Think }}{{ .Messages }}", "{{ currentDat }}"])
def test_what_is_not_reproduced_raises(source: str) -> None:
    with pytest.raises(TemplateError):
        OllamaTemplate(source).render(USER, today=TODAY)
