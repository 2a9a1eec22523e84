"""Issue 23, point 3c: with tenants configured, a request with no key, or with a key that is not a bearer one
(``Authorization: Basic ...``, ``Token <key>``), runs with the caps of ``[tenants.anonymous]``, and when that table
sets none, with the tightest of every configured tenant's caps, field by field. The attack: such requests ran as
``anonymous`` with no caps at all, so every tenant's caps were one header away from advisory."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.admission.keyless import keyless_caps_line
from gateway.admission.rates import RateLimit
from gateway.admission.tenant_keys import ANONYMOUS, Tenant, TenantDirectory
from gateway.config.settings import load_settings

BACKENDS = [{"name": "b", "url": "http://127.0.0.1:9"}]
TENANTS: dict[str, Any] = {
    "ci": {"api_keys": ["ci-key-0001"], "max_active": 2, "max_prompt_tokens": 50, "tokens_per_minute": 3000,
           "priority": -1, "max_pool_share": 0.5},
    "team": {"api_keys": ["team-key-0001"], "max_active": 4, "max_output_tokens": 256, "requests_per_minute": 30,
             "priority": 5, "weight": 0.5, "max_pool_share": 0.25, "max_queued": 20},
}
TIGHTEST = Tenant(ANONYMOUS, max_active=2, max_prompt_tokens=50, max_output_tokens=256, priority=-1,
                  max_pool_share=0.25, rate=RateLimit(3000, 30), weight=0.5, max_queued=20)
KEYLESS = [{}, {"Authorization": "Basic dXNlcjpwdw=="}, {"Authorization": "Token ci-key-0001"},
           {"Authorization": "ci-key-0001"}]


def directory(tenants: dict[str, Any]) -> TenantDirectory:
    return TenantDirectory(load_settings(None, backends=BACKENDS, tenants=tenants))


@pytest.mark.parametrize("headers", KEYLESS, ids=["none", "basic", "token", "bare"])
def test_keyless_requests_get_the_tightest_caps_when_anonymous_sets_none(headers: dict[str, str]) -> None:
    for tenants in (TENANTS, {**TENANTS, "anonymous": {"allow_unknown_keys": True}}):
        assert directory(tenants).identify(headers) == TIGHTEST  # before the fix: Tenant('anonymous'), no caps


def test_an_unknown_key_let_in_as_anonymous_gets_the_same_caps() -> None:
    lenient = directory({**TENANTS, "anonymous": {"allow_unknown_keys": True}})
    assert lenient.identify({"X-Api-Key": "sk-nobody"}) == TIGHTEST


def test_configured_anonymous_caps_are_used_as_written() -> None:
    own = {"max_prompt_tokens": 20, "priority": -5}
    found = directory({**TENANTS, "anonymous": own}).identify({"Authorization": "Basic dXNlcjpwdw=="})
    assert found == Tenant(ANONYMOUS, max_prompt_tokens=20, priority=-5)


def test_without_tenant_keys_keyless_requests_are_uncapped_unless_anonymous_says() -> None:
    assert directory({}).identify({}) == Tenant(ANONYMOUS)
    assert directory({"anonymous": {"max_active": 1}}).identify({}) == Tenant(ANONYMOUS, max_active=1)


def test_the_start_up_line_says_which_caps_keyless_requests_get() -> None:
    rows = [
        ("no tenants", {}, "keyless requests are uncapped: no tenant has an API key"),
        ("anonymous caps", {**TENANTS, "anonymous": {"max_prompt_tokens": 20}},
         "keyless requests (no key, or one not sent as 'Authorization: Bearer' or 'X-Api-Key') run as tenant "
         "'anonymous' with the caps of [tenants.anonymous]: max_prompt_tokens=20"),
        ("tightest", TENANTS,
         "keyless requests (no key, or one not sent as 'Authorization: Bearer' or 'X-Api-Key') run as tenant "
         "'anonymous' with the tightest of every tenant's caps ([tenants.anonymous] sets none): max_active=2, "
         "max_prompt_tokens=50, max_output_tokens=256, max_pool_share=0.25, max_queued=20, "
         "tokens_per_minute=3000, requests_per_minute=30, priority=-1, weight=0.5"),
        ("tenants, no caps", {"team": {"api_keys": ["team-key-0001"]}},
         "keyless requests (no key, or one not sent as 'Authorization: Bearer' or 'X-Api-Key') run as tenant "
         "'anonymous' uncapped: neither [tenants.anonymous] nor any tenant sets a cap"),
    ]
    print()
    for name, tenants, expected in rows:
        line = keyless_caps_line(load_settings(None, backends=BACKENDS, tenants=tenants))
        print(f"{name:17} {line}")
        assert line == expected
    required = load_settings(None, backends=BACKENDS, tenants=TENANTS, server={"require_api_key": True})
    assert keyless_caps_line(required) == "keyless requests are refused (401): server.require_api_key = true"
