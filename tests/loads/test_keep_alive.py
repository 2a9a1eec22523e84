"""Issue 23, point 4d, the pure part: which keep_alive values only the admin may send, and what becomes of them."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import BadRequest
from gateway.loads.keep_alive import AS_SENT, client_keep_alive, sign_of


@pytest.mark.parametrize(("value", "sign"), [
    (0, 0), (0.0, 0), ("0", 0), ("0s", 0), ("0m0s", 0), (" 0 ", 0),
    (-1, -1), ("-1", -1), ("-1m", -1), ("-1h30m", -1), (-0.5, -1),
    (300, 1), ("5m", 1), ("1h30m", 1), ("300", 1), ("1.5h", 1),
    ("soon", None), ("", None), (True, None), (None, None), ([0], None),
])  # fmt: skip
def test_sign_of(value: object, sign: int | None) -> None:
    assert sign_of(value) == sign


BODY: dict[str, Any] = {"model": "m", "messages": [], "keep_alive": 0}


def test_strip_removes_an_unload_or_a_pin_and_says_so() -> None:
    for value in (0, "0s", -1, "-1m"):
        verdict = client_keep_alive({**BODY, "keep_alive": value}, "strip", admin=False)
        assert verdict.body == {"model": "m", "messages": []}
        assert verdict.note is not None and "stripped keep_alive" in verdict.note
    print("\n" + str(client_keep_alive(BODY, "strip", admin=False).note))


def test_other_values_the_admin_and_allow_pass_as_sent() -> None:
    assert client_keep_alive({**BODY, "keep_alive": "10m"}, "strip", admin=False) is AS_SENT
    assert client_keep_alive({"model": "m"}, "refuse", admin=False) is AS_SENT
    assert client_keep_alive(BODY, "strip", admin=True) is AS_SENT
    assert client_keep_alive(BODY, "refuse", admin=True) is AS_SENT
    assert client_keep_alive(BODY, "allow", admin=False) is AS_SENT
    assert client_keep_alive({**BODY, "keep_alive": "soon"}, "strip", admin=False) is AS_SENT  # Ollama's to refuse


def test_refuse_names_the_setting_and_the_value() -> None:
    with pytest.raises(BadRequest) as refused:
        client_keep_alive({**BODY, "keep_alive": "-1m"}, "refuse", admin=False)
    assert "keep_alive '-1m' keeps the model loaded for good" in refused.value.message
    assert 'residency.client_keep_alive = "refuse"' in refused.value.message
