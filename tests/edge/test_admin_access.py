"""Admin access: the admin key as a Bearer token, or loopback clients when none is set; where kvgate is exposed."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from pydantic import SecretStr

from gateway.edge.admin_access import admin_allowed, is_loopback_host, require_admin
from gateway.errors import AdminOnly


def _request(remote: str, authorization: str | None = None) -> web.Request:
    headers = {"Authorization": authorization} if authorization else {}
    request = make_mocked_request("GET", "/kvgate/status", headers=headers)
    return request.clone(remote=remote)


@pytest.mark.parametrize(("remote", "authorization", "key", "allowed"), [
    ("127.0.0.1", None, None, True),
    ("::1", None, None, True),
    ("10.0.0.5", None, None, False),
    ("not an address", None, None, False),
    ("10.0.0.5", "Bearer admin", "admin", True),
    ("127.0.0.1", None, "admin", False),  # with a key, loopback is no excuse
    ("10.0.0.5", "Bearer wrong", "admin", False),
])
def test_admin_allowed(remote: str, authorization: str | None, key: str | None, allowed: bool) -> None:
    admin_key = SecretStr(key) if key else None
    request = _request(remote, authorization)
    assert admin_allowed(request, admin_key) is allowed


def test_require_admin_raises_admin_only_with_its_message() -> None:
    with pytest.raises(AdminOnly, match=r"^this kvgate route needs the admin key \(server\.admin_key\) as a Bearer "
                                        r"token, or a loopback client when none is set$"):
        require_admin(_request("10.0.0.5"), None)
    require_admin(_request("127.0.0.1"), None)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("localhost", True), ("LOCALHOST.", True), ("[::1]", True), ("::1", True),
    ("0.0.0.0", False), ("", False), ("192.168.1.2", False), ("example.com", False),
])
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


