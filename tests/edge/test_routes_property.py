"""Property: no JSON value and no byte string makes a parser crash; the worst is a 4xx GatewayError."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import dialects
from gateway.edge.routes import ROUTES, Handling, Route
from gateway.errors import GatewayError

PARSED = [route for route in ROUTES if route.handling is Handling.PARSED]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
KEYS = ["model", "messages", "prompt", "stream", "options", "tools", "input", "max_tokens", "max_completion_tokens",
        "max_output_tokens", "n_predict", "content", "tokens", "keep_alive", "system", "images", "name"]
shaped = st.fixed_dictionaries({}, optional={key: json_values for key in KEYS}) | st.dictionaries(
    st.sampled_from(KEYS), st.fixed_dictionaries({}, optional={"num_ctx": json_values, "role": json_values,
                                                               "content": json_values}) | st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "num_ctx"]), json_values, max_size=3), max_size=3))


def _parse_everywhere(body: dict[str, Any], routes: list[Route] = PARSED) -> None:
    for route in routes:
        try:
            parsed = dialects.parse(route.dialect, route.operation, body, route.path)
        except GatewayError as exc:
            assert 400 <= exc.status < 500, exc
            assert exc.message
        else:
            assert parsed.model is None or isinstance(parsed.model, str)


@pytest.mark.parametrize("half", [0, 1])
@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(shaped)
def test_shaped_bodies_never_crash(half: int, body: dict[str, Any]) -> None:
    """Every parsed route, in two halves (each a test of its own, under 2 s)."""
    _parse_everywhere(body, PARSED[half::2])


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=6))
def test_arbitrary_objects_never_crash(body: dict[str, Any]) -> None:
    _parse_everywhere(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_decode_or_give_400(raw: bytes) -> None:
    try:
        body = dialects.decode_body(raw)
    except GatewayError as exc:
        assert exc.status == 400
    else:
        _parse_everywhere(body)


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"1e999999", b"[" * 2000, b"null", b'{"model": "\xff"'])
def test_nasty_bytes_give_400(raw: bytes) -> None:
    with pytest.raises(GatewayError) as caught:
        dialects.decode_body(raw)
    assert caught.value.status == 400


@pytest.mark.parametrize("raw", [b'{"model": "\xed\xa0\x80"}', b'{"model": "caf\xe9"}', b'{"model": "\\udc80"}'])
def test_strings_with_invalid_utf8_are_accepted_as_go_and_cpp_servers_accept_them(raw: bytes) -> None:
    assert isinstance(dialects.decode_body(raw)["model"], str)
