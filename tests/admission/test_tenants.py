"""TenantDirectory: API key -> tenant, compared in constant time against every key; anonymous without keys."""

from __future__ import annotations

import hmac
import types
from typing import Any

import pytest

from gateway.admission import tenants as tenants_module
from gateway.admission.tenants import ANONYMOUS, Tenant, TenantDirectory, presented_key
from gateway.config import load_settings
from gateway.errors import Unauthorized

BACKENDS = [{"name": "b", "url": "http://127.0.0.1:9"}]
TENANTS = {
    "ci": {"api_keys": ["ci-key-0001", "ci-key-0002"], "max_active": 2, "max_prompt_tokens": 50,
           "max_output_tokens": 128, "priority": -1},
    "team": {"api_keys": ["team-key-0001"], "priority": 5},
}


def directory(*, required: bool = False, tenants: dict[str, Any] | None = None) -> TenantDirectory:
    settings = load_settings(None, backends=BACKENDS, tenants=TENANTS if tenants is None else tenants,
                             server={"require_api_key": required})
    return TenantDirectory(settings)


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"Authorization": "Bearer abc"}, "abc"),
        ({"Authorization": "bearer  abc "}, "abc"),
        ({"Authorization": "BEARER abc"}, "abc"),
        ({"X-Api-Key": "abc"}, "abc"),
        ({"Authorization": "Bearer abc", "X-Api-Key": "other"}, "abc"),  # Authorization wins
        ({"Authorization": "Basic dXNlcjpwdw=="}, None),  # not a bearer key, and no X-Api-Key
        ({"Authorization": "Basic dXNlcjpwdw==", "X-Api-Key": "abc"}, "abc"),
        ({"Authorization": "Bearer "}, None),
        ({"X-Api-Key": ""}, None),
        ({}, None),
    ],
)
def test_presented_key(headers: dict[str, str], key: str | None) -> None:
    assert presented_key(headers) == key


@pytest.mark.parametrize(
    ("headers", "tenant"),
    [
        ({"Authorization": "Bearer ci-key-0001"}, "ci"),
        ({"X-Api-Key": "ci-key-0002"}, "ci"),
        ({"Authorization": "Bearer team-key-0001"}, "team"),
    ],
)
def test_each_key_names_its_tenant_with_its_caps(headers: dict[str, str], tenant: str) -> None:
    found = directory(required=True).identify(headers)
    assert found.name == tenant
    if tenant == "ci":
        assert found == Tenant("ci", max_active=2, max_prompt_tokens=50, max_output_tokens=128, priority=-1)
    else:
        assert found == Tenant("team", priority=5)


@pytest.mark.parametrize(
    "key",
    ["ci-key-000", "ci-key-00011", "ci-key-0003", "CI-KEY-0001", "team-key-0001 x", "x"],
    ids=["prefix", "longer", "last-byte", "case", "suffix", "short"],
)
def test_near_misses_are_no_ones_key(key: str) -> None:
    assert directory().identify({"X-Api-Key": key}) == Tenant(ANONYMOUS)
    with pytest.raises(Unauthorized, match="is not one of kvgate's"):
        directory(required=True).identify({"X-Api-Key": key})


@pytest.mark.parametrize(
    "key",
    ["ci-key-0001\udcff", "ci-key-0001\x00", "ci-key-\u00e90001", "ci-key-0001\t", "ci-key\n-0001"],
    ids=["surrogate", "nul", "non-ascii", "tab", "newline"],
)
def test_malformed_keys_match_nothing(key: str) -> None:
    """Header bytes that are not printable ASCII (non-UTF-8 ones arrive as lone surrogates) are no one's key."""
    assert directory().identify({"X-Api-Key": key}).name == ANONYMOUS
    with pytest.raises(Unauthorized, match="is not one of kvgate's"):
        directory(required=True).identify({"X-Api-Key": key})


def test_without_a_key_anonymous_unless_keys_are_required() -> None:
    assert directory().identify({}) == Tenant(ANONYMOUS)
    with pytest.raises(Unauthorized, match="no API key was sent") as refused:
        directory(required=True).identify({})
    assert "'Authorization: Bearer <key>'" in str(refused.value)


def test_no_tenants_means_everyone_is_anonymous_and_keys_pass_through() -> None:
    open_door = directory(tenants={})
    assert not open_door.enabled  # the client's key is the backend's business, not kvgate's
    assert open_door.identify({"Authorization": "Bearer sk-for-the-backend"}).name == ANONYMOUS
    assert directory().enabled


@pytest.mark.parametrize("given", ["ci-key-0001", "team-key-0001", "nobody-key-1", "ci-key-0001\udcff"])
def test_every_key_is_compared_in_constant_time_whichever_matches(
    given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No early exit: the time taken says nothing about which key (or how much of one) matched."""
    compared: list[tuple[bytes, bytes]] = []

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return hmac.compare_digest(a, b)

    tenants = directory()
    monkeypatch.setattr(tenants_module, "hmac", types.SimpleNamespace(compare_digest=compare_digest))
    tenants.identify({"X-Api-Key": given})
    assert sorted(key for _, key in compared) == [b"ci-key-0001", b"ci-key-0002", b"team-key-0001"]
    assert {presented for presented, _ in compared} == {given.encode() if given.isascii() else b""}


def test_no_secret_in_any_repr() -> None:
    tenants = directory(required=True)
    found = tenants.identify({"X-Api-Key": "ci-key-0001"})
    settings = load_settings(None, backends=BACKENDS, tenants=TENANTS)
    for text in (repr(tenants), str(tenants), repr(found), repr(settings.tenants), str(settings)):
        assert "key-000" not in text, text
    with pytest.raises(Unauthorized) as refused:
        tenants.identify({"X-Api-Key": "ci-key-0003"})
    assert "ci-key-0003" not in str(refused.value)  # nor is the key that was sent echoed
