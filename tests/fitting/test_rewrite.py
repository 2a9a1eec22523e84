"""Rewrites touch only the named field, in the field each dialect uses, and keep odd bytes as they came."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway import dialects
from gateway.domain import Dialect, Operation, Rewrites
from gateway.fitting.rewrite import apply_rewrites, encode_body


def _parsed(dialect: Dialect, path: str, body: dict[str, Any]) -> Any:
    if "responses" in path:
        return dialects.parse(dialect, Operation.RESPONSES, body, path)
    return dialects.parse(dialect, Operation.CHAT if "chat" in path or "messages" in path else Operation.GENERATE,
                          body, path)


@pytest.mark.parametrize(
    ("dialect", "path", "body", "rewrites", "expected", "note"),
    [
        (Dialect.OLLAMA, "/api/chat", {"model": "m", "messages": [], "options": {"num_ctx": 2048, "top_k": 3}},
         Rewrites(num_ctx=8192), {"options": {"num_ctx": 8192, "top_k": 3}}, "options.num_ctx=8192 (was 2048)"),
        (Dialect.OLLAMA, "/api/generate", {"model": "m", "prompt": "p"}, Rewrites(num_ctx=4096, max_output_tokens=9),
         {"options": {"num_ctx": 4096, "num_predict": 9}}, "options.num_ctx=4096 (was unset)"),
        (Dialect.OPENAI, "/v1/chat/completions", {"model": "m", "messages": [], "max_completion_tokens": 900},
         Rewrites(num_ctx=8192, max_output_tokens=100), {"max_completion_tokens": 100},
         "max_completion_tokens=100 (was 900)"),
        (Dialect.OPENAI, "/v1/responses", {"model": "m", "input": "x"}, Rewrites(max_output_tokens=5),
         {"max_output_tokens": 5}, "max_output_tokens=5 (was unset)"),
        (Dialect.ANTHROPIC, "/v1/messages", {"model": "m", "messages": [], "max_tokens": 50},
         Rewrites(max_output_tokens=20), {"max_tokens": 20}, "max_tokens=20 (was 50)"),
        (Dialect.LLAMACPP, "/completion", {"prompt": "p", "max_tokens": 70}, Rewrites(max_output_tokens=7),
         {"max_tokens": 7}, "max_tokens=7 (was 70)"),
    ],
)
def test_fields_per_dialect(dialect: Dialect, path: str, body: dict[str, Any], rewrites: Rewrites,
                            expected: dict[str, Any], note: str) -> None:
    parsed = _parsed(dialect, path, body)
    new_body, changes = apply_rewrites(parsed, rewrites)
    assert new_body is not None
    for key, value in expected.items():
        assert new_body[key] == value
    assert changes[0] == note
    assert {k: v for k, v in new_body.items() if k not in expected} == {k: v for k, v in body.items()
                                                                         if k not in expected}
    assert parsed.body == body  # the client's body is untouched


def test_no_change_means_the_original_bytes() -> None:
    parsed = _parsed(Dialect.OLLAMA, "/api/chat", {"model": "m", "options": {"num_ctx": 8192}})
    assert apply_rewrites(parsed, Rewrites(num_ctx=8192)) == (None, [])
    assert apply_rewrites(parsed, Rewrites()) == (None, [])


def test_invalid_utf8_survives_a_rewrite() -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":"caf\xe9 \xff"}]}'
    parsed = _parsed(Dialect.OLLAMA, "/api/chat", dialects.decode_body(raw))
    new_body, _ = apply_rewrites(parsed, Rewrites(num_ctx=4096))
    assert new_body is not None
    encoded = encode_body(new_body)
    assert b"caf\xe9 \xff" in encoded and b'"num_ctx":4096' in encoded


def test_the_clients_nested_objects_are_copied_not_changed() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"num_ctx": 2048, "seed": 1}}
    snapshot = copy.deepcopy(body)
    parsed = _parsed(Dialect.OLLAMA, "/api/chat", body)
    new_body, changes = apply_rewrites(parsed, Rewrites(num_ctx=8192, max_output_tokens=64))
    assert new_body is not None and len(changes) == 2
    assert new_body["options"] == {"num_ctx": 8192, "seed": 1, "num_predict": 64}
    assert body == snapshot and parsed.body == snapshot  # neither the top level nor options changed
    assert new_body["messages"] is body["messages"]  # untouched parts are shared, not copied
