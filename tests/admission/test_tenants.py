"""TenantDirectory: API key -> tenant, compared in constant time (as sha256 digests) against every key; a missing key
gets the anonymous policy, an unknown one a 401 once kvgate has keys (unless the anonymous policy allows it)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Callable
from typing import Any

import pytest

from gateway.admission.tenant_keys import ANONYMOUS, Tenant, TenantDirectory, presented_key
from gateway.config.settings import ConfigError, load_settings
from gateway.errors import Unauthorized

BACKENDS = [{"name": "b", "url": "http://127.0.0.1:9"}]
TEAM_KEY = "team-key-0001"
TEAM_DIGEST = hashlib.sha256(TEAM_KEY.encode()).hexdigest()
TENANTS: dict[str, Any] = {
    "ci": {"api_keys": ["ci-key-0001", "ci-key-0002"], "max_active": 2, "max_prompt_tokens": 50,
           "max_output_tokens": 128, "priority": -1},
    "team": {"api_key_sha256": [TEAM_DIGEST], "priority": 5},  # stored hashed: `printf %s KEY | sha256sum`
}
ANONYMOUS_CAPS: dict[str, Any] = {"max_active": 1, "max_prompt_tokens": 20, "max_output_tokens": 64, "priority": -5}
TIGHTEST = Tenant(ANONYMOUS, max_active=2, max_prompt_tokens=50, max_output_tokens=128, priority=-1)
"""Keyless with tenants and no anonymous caps: the tightest of the tenants' caps (issue 23, keyless.py)."""


def directory(*, required: bool = False, tenants: dict[str, Any] | None = None,
              admin_key: str | None = None,
              compare_digest: Callable[[bytes, bytes], bool] = hmac.compare_digest) -> TenantDirectory:
    settings = load_settings(None, backends=BACKENDS, tenants=TENANTS if tenants is None else tenants,
                             server={"require_api_key": required, "admin_key": admin_key})
    return TenantDirectory(settings, compare_digest=compare_digest)


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


# The rule, as a table: who a request runs as, by configuration and by the key it carries.
CONFIGS: dict[str, tuple[dict[str, Any], bool]] = {
    "no tenants": ({}, False),
    "anonymous caps only": ({"anonymous": ANONYMOUS_CAPS}, False),
    "tenants": (TENANTS, False),
    "tenants + anonymous policy": ({**TENANTS, "anonymous": ANONYMOUS_CAPS}, False),
    "tenants + allow_unknown_keys": ({**TENANTS, "anonymous": {**ANONYMOUS_CAPS, "allow_unknown_keys": True}}, False),
    "require_api_key": (TENANTS, True),
    "require_api_key + anon policy": ({**TENANTS, "anonymous": ANONYMOUS_CAPS}, True),
}
KEYS: dict[str, dict[str, str]] = {
    "no key": {},
    "unknown key": {"Authorization": "Bearer sk-not-kvgates"},
    "plain key": {"Authorization": "Bearer ci-key-0001"},
    "hashed key": {"X-Api-Key": TEAM_KEY},
    "odd bytes": {"X-Api-Key": "ci-key-0001\udcff"},  # ci's key and a byte that is not UTF-8
}
EXPECTED = """\
configuration                 | no key     | unknown key | plain key  | hashed key | odd bytes
------------------------------+------------+-------------+------------+------------+-----------
no tenants                    | anonymous  | anonymous   | anonymous  | anonymous  | anonymous
anonymous caps only           | anonymous+ | anonymous+  | anonymous+ | anonymous+ | anonymous+
tenants                       | anonymous- | 401         | ci         | team       | 401
tenants + anonymous policy    | anonymous+ | 401         | ci         | team       | 401
tenants + allow_unknown_keys  | anonymous+ | anonymous+  | ci         | team       | anonymous+
require_api_key               | 401        | 401         | ci         | team       | 401
require_api_key + anon policy | 401        | 401         | ci         | team       | 401
(anonymous+: the tenant 'anonymous' with the caps of [tenants.anonymous]; anonymous-: with the tightest of the
tenants' caps, [tenants.anonymous] setting none; 401: Unauthorized)"""


def _outcome(tenants: TenantDirectory, headers: dict[str, str]) -> str:
    try:
        found = tenants.identify(headers)
    except Unauthorized:
        return "401"
    if found.name == ANONYMOUS:
        assert found in (Tenant(ANONYMOUS), Tenant(ANONYMOUS, **ANONYMOUS_CAPS), TIGHTEST)
        return "anonymous-" if found == TIGHTEST else "anonymous+" if found.max_prompt_tokens else "anonymous"
    return found.name


def _row(cells: list[str]) -> str:
    return " | ".join(cell.ljust(width) for cell, width in zip(cells, (29, 10, 11, 10, 10, 10), strict=True)).rstrip()


def test_the_matrix_of_configurations_and_keys() -> None:
    lines = [_row(["configuration", *KEYS]), "-+-".join("-" * width for width in (29, 10, 11, 10, 10, 10))]
    for config, (tenants, required) in CONFIGS.items():
        found = directory(tenants=tenants, required=required)
        lines.append(_row([config, *(_outcome(found, headers) for headers in KEYS.values())]))
    lines.append("(anonymous+: the tenant 'anonymous' with the caps of [tenants.anonymous]; anonymous-: with the "
                 "tightest of the\ntenants' caps, [tenants.anonymous] setting none; 401: Unauthorized)")
    table = "\n".join(lines)
    print("\n" + table)
    assert table == EXPECTED


@pytest.mark.parametrize(
    ("headers", "tenant"),
    [
        ({"Authorization": "Bearer ci-key-0001"}, "ci"),
        ({"X-Api-Key": "ci-key-0002"}, "ci"),
        ({"Authorization": f"Bearer {TEAM_KEY}"}, "team"),
        ({"X-Api-Key": TEAM_KEY}, "team"),
    ],
)
def test_each_key_names_its_tenant_with_its_caps(headers: dict[str, str], tenant: str) -> None:
    for required in (True, False):
        found = directory(required=required).identify(headers)
        if tenant == "ci":
            assert found == Tenant("ci", max_active=2, max_prompt_tokens=50, max_output_tokens=128, priority=-1)
        else:
            assert found == Tenant("team", priority=5)


def test_a_tenant_may_have_plain_and_hashed_keys_and_upper_case_digests() -> None:
    tenants = {"both": {"api_keys": ["plain-key-1"], "api_key_sha256": [TEAM_DIGEST.upper()]}}
    found = directory(tenants=tenants)
    assert found.identify({"X-Api-Key": "plain-key-1"}).name == "both"
    assert found.identify({"X-Api-Key": TEAM_KEY}).name == "both"
    with pytest.raises(Unauthorized):
        found.identify({"X-Api-Key": TEAM_DIGEST})  # the digest itself is not a key


@pytest.mark.parametrize(
    "key",
    ["ci-key-000", "ci-key-00011", "ci-key-0003", "CI-KEY-0001", "team-key-0001 x", "team-key-000", "x"],
    ids=["prefix", "longer", "last-byte", "case", "suffix", "hashed-prefix", "short"],
)
def test_near_misses_are_no_ones_key(key: str) -> None:
    for required in (False, True):
        with pytest.raises(Unauthorized, match="is not one of kvgate's"):
            directory(required=required).identify({"X-Api-Key": key})
    lenient = directory(tenants={**TENANTS, "anonymous": {"allow_unknown_keys": True}})
    assert lenient.identify({"X-Api-Key": key}) == TIGHTEST  # let in, but never with more than any tenant


@pytest.mark.parametrize(
    "key",
    ["ci-key-0001\udcff", "ci-key-0001\x00", "ci-key-\u00e90001", "ci-key-0001\t", "ci-key\n-0001",
     "team-key-0001\x7f"],
    ids=["surrogate", "nul", "non-ascii", "tab", "newline", "del"],
)
def test_malformed_keys_match_nothing(key: str) -> None:
    """Header bytes that are not printable ASCII (non-UTF-8 ones arrive as lone surrogates) are no one's key."""
    for required in (False, True):
        with pytest.raises(Unauthorized, match="is not one of kvgate's"):
            directory(required=required).identify({"X-Api-Key": key})
    assert directory(tenants={}).identify({"X-Api-Key": key}) == Tenant(ANONYMOUS)


def test_a_missing_key_gets_the_anonymous_policy_unless_keys_are_required() -> None:
    assert directory().identify({}) == TIGHTEST  # no [tenants.anonymous]: the tightest of the tenants' caps
    capped = directory(tenants={**TENANTS, "anonymous": ANONYMOUS_CAPS})
    assert capped.identify({}) == capped.anonymous == Tenant(ANONYMOUS, **ANONYMOUS_CAPS)
    with pytest.raises(Unauthorized, match="no API key was sent") as refused:
        directory(required=True).identify({})
    assert "'Authorization: Bearer <key>'" in str(refused.value)


def test_an_unknown_key_is_told_what_to_do() -> None:
    with pytest.raises(Unauthorized) as refused:
        directory().identify({"X-Api-Key": "sk-wrong-1"})
    assert str(refused.value) == ("the API key is not one of kvgate's; send a tenant's key as 'Authorization: Bearer "
                                  "<key>' or 'X-Api-Key', or none to run as the tenant 'anonymous'")
    with pytest.raises(Unauthorized) as refused:
        directory(required=True).identify({"X-Api-Key": "sk-wrong-1"})
    assert "anonymous" not in str(refused.value)  # with keys required, sending none is no way in


def test_without_tenant_keys_everyone_is_anonymous_and_keys_pass_through() -> None:
    open_door = directory(tenants={})
    assert not open_door.enabled  # the client's key is the backend's business, not kvgate's
    assert open_door.identify({"Authorization": "Bearer sk-for-the-backend"}) == Tenant(ANONYMOUS)
    capped = directory(tenants={"anonymous": ANONYMOUS_CAPS})
    assert not capped.enabled  # anonymous caps alone make no key kvgate's
    assert capped.identify({"Authorization": "Bearer sk-for-the-backend"}) == Tenant(ANONYMOUS, **ANONYMOUS_CAPS)
    assert directory().enabled
    assert directory(tenants={"team": TENANTS["team"]}).enabled  # hashed keys alone are kvgate's too


@pytest.mark.parametrize("given", ["ci-key-0001", TEAM_KEY, "nobody-key-1", "ci-key-0001\udcff"])
def test_every_key_is_compared_in_constant_time_whichever_matches(given: str) -> None:
    """The presented key is hashed once and its digest compared with every configured digest, all of one length:
    no early exit, so the time taken says nothing about which key (or how much of one) matched."""
    compared: list[tuple[bytes, bytes]] = []

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return hmac.compare_digest(a, b)

    tenants = directory(compare_digest=compare_digest)
    with contextlib.suppress(Unauthorized):
        tenants.identify({"X-Api-Key": given})
    expected = sorted(hashlib.sha256(key.encode()).digest() for key in ("ci-key-0001", "ci-key-0002", TEAM_KEY))
    assert sorted(configured for _, configured in compared) == expected
    presented = hashlib.sha256(given.encode() if given.isascii() else b"").digest()
    assert {digest for digest, _ in compared} == {presented}


@pytest.mark.parametrize(
    ("tenants", "admin_key", "required", "message"),
    [
        ({"a": {"api_keys": ["k-1"]}, "b": {"api_keys": ["k-1"]}}, None, False, "more than one tenant"),
        ({"a": {"api_keys": ["k-1"]}, "b": {"api_key_sha256": [hashlib.sha256(b"k-1").hexdigest()]}}, None, False,
         "more than one tenant"),
        ({"a": {"api_keys": ["k-1"], "api_key_sha256": [hashlib.sha256(b"k-1").hexdigest()]}}, None, False,
         "listed twice"),
        ({"a": {"api_key_sha256": [TEAM_DIGEST, TEAM_DIGEST.upper()]}}, None, False, "listed twice"),
        ({"anonymous": {"api_keys": ["k-1"]}}, None, False, "tenants.anonymous .* has no api_keys"),
        ({"anonymous": {"api_key_sha256": [TEAM_DIGEST]}}, None, False, "tenants.anonymous .* has no api_keys"),
        ({"ci": {"api_keys": ["k-1"], "allow_unknown_keys": True}}, None, False,
         "allow_unknown_keys is a setting of tenants.anonymous only; not: ci"),
        ({"team": TENANTS["team"]}, TEAM_KEY, False, "admin_key is also a tenant's API key"),
        ({"anonymous": ANONYMOUS_CAPS}, None, True, "no tenant has api_keys or api_key_sha256"),
        ({**TENANTS, "anonymous": {"allow_unknown_keys": True}}, None, True, "choose one"),
    ],
    ids=["plain-twice", "plain-and-hashed", "same-tenant", "digest-case", "anonymous-keys", "anonymous-hashed",
         "lenient-ci", "admin-hashed", "required-no-keys", "required-and-lenient"],
)
def test_tenant_configuration_is_checked(
    tenants: dict[str, Any], admin_key: str | None, required: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        directory(tenants=tenants, admin_key=admin_key, required=required)
    for secret in ("k-1", TEAM_KEY, TEAM_DIGEST, TEAM_DIGEST.upper()):
        assert secret not in str(refused.value)
    assert directory(tenants={"team": TENANTS["team"]}, required=True).enabled  # hashed keys alone may be required


@pytest.mark.parametrize(
    "digest",
    [TEAM_DIGEST[:-1], TEAM_DIGEST + "0", "g" * 64, f"{TEAM_DIGEST}  -", TEAM_KEY, ""],
    ids=["short", "long", "not-hex", "sha256sum-line", "the-key-itself", "empty"],
)
def test_a_digest_must_be_64_hex_digits_and_is_never_echoed(digest: str) -> None:
    with pytest.raises(ConfigError) as refused:
        directory(tenants={"team": {"api_key_sha256": ["0" * 64, digest]}})
    message = str(refused.value)
    assert "tenants.team.api_key_sha256" in message and "digest 2 of 2 is not 64 hex digits" in message
    assert "sha256sum" in message
    assert (digest or "\0") not in message and TEAM_KEY not in message


def test_no_key_or_digest_in_any_repr_or_error() -> None:
    settings = load_settings(None, backends=BACKENDS, tenants={**TENANTS, "anonymous": ANONYMOUS_CAPS})
    tenants = TenantDirectory(settings)
    found = tenants.identify({"X-Api-Key": TEAM_KEY})
    for text in (repr(tenants), str(tenants), repr(found), repr(settings.tenants), str(settings),
                 repr(settings), str(settings.model_dump()), repr(tenants.anonymous)):
        for secret in ("key-000", TEAM_DIGEST, TEAM_DIGEST[:16]):
            assert secret not in text, text
    with pytest.raises(Unauthorized) as refused:
        tenants.identify({"X-Api-Key": "ci-key-0003"})
    assert "ci-key-0003" not in str(refused.value)  # nor is the key that was sent echoed
