"""A reload never drops kvgate's protection by accident (issue 23, point 5).

The attack: an empty configuration file (an editor's truncate-then-write, a bad deploy, an attacker who can write
the file but not restart kvgate) on SIGHUP was applied: ``require_api_key``, the admin key and every tenant gone;
a keyless chat went from 401 to 200 and ``/kvgate/status`` from 403 to 200. Now a reload that would remove every
tenant key, the admin key, or turn ``require_api_key`` off is refused (a SECURITY warning, the running settings
stay) unless the new file sets ``server.allow_reload_to_drop_security = true``; and a file that is empty, or only
whitespace and comments, is refused on reload whatever it would change.
"""

from __future__ import annotations

import functools
import logging
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.admission.tenant_keys import TenantDirectory
from gateway.config.reload import LiveSettings, Reloader, ReloadRefused
from gateway.config.reload_guard import refusing_empty_file, security_drops
from gateway.config.settings import Settings, load_settings
from tests.support.fake_backend import FakeLLM, running
from tests.support.serve_process import serving_config

ADMIN = "admin-secret-key"
SECURE: dict[str, Any] = {
    "server": {"require_api_key": True, "admin_key": ADMIN},
    "tenants": {"ci": {"api_keys": ["ci-key"]}, "team": {"api_keys": ["team-key"]}},
}
ALLOW = {"allow_reload_to_drop_security": True}

GUARD_MATRIX: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    # case: (the new settings, what the guard names; () = the reload applies)
    "nothing (the empty file's settings)": ({}, ("tenant keys", "admin key", "require_api_key")),
    "every tenant's keys removed": ({"server": SECURE["server"] | {"require_api_key": False},
                                     "tenants": {"ci": {}, "team": {}}}, ("tenant keys", "require_api_key")),
    "the admin key removed": ({**SECURE, "server": {"require_api_key": True}}, ("admin key",)),
    "require_api_key turned off": ({**SECURE, "server": {"admin_key": ADMIN}}, ("require_api_key",)),
    "a key hashed instead of plain": ({**SECURE, "tenants": {"ci": {"api_key_sha256": ["a" * 64]}}}, ()),
    "one tenant removed": ({**SECURE, "tenants": {"ci": {"api_keys": ["ci-key"]}}}, ()),
    "the admin key rotated": ({**SECURE, "server": {"require_api_key": True, "admin_key": "rotated-key"}}, ()),
    "a cap changed": ({**SECURE, "tenants": {**SECURE["tenants"], "ci": {"api_keys": ["ci-key"], "max_active": 1}}},
                      ()),
}


def _drops_named(drops: tuple[str, ...]) -> tuple[str, ...]:
    names = {"tenant keys": "every tenant's API key", "admin key": "server.admin_key",
             "require_api_key": "server.require_api_key"}
    return tuple(short for short, long in names.items() if any(long in drop for drop in drops))


def _reloader(running: Settings, loaded: Settings) -> tuple[LiveSettings[TenantDirectory], Reloader]:
    live = LiveSettings(running, directory=TenantDirectory)
    return live, Reloader(live, lambda: loaded)


async def test_the_guard_matrix(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.config.reload")
    running_settings = load_settings(None, **SECURE)
    rows = []
    for case, (change, named) in GUARD_MATRIX.items():
        loaded = load_settings(None, **change)
        assert _drops_named(security_drops(running_settings, loaded)) == named, case
        live, reloader = _reloader(running_settings, loaded)
        caplog.clear()
        try:
            await reloader.reload("test")
        except ReloadRefused as exc:
            outcome = "refused"
            assert exc.param == "server.allow_reload_to_drop_security" and live.settings is running_settings
            warning = [r for r in caplog.records if r.levelno == logging.WARNING and "SECURITY" in r.getMessage()]
            assert warning and "allow_reload_to_drop_security = true" in warning[0].getMessage(), case
            assert ADMIN not in caplog.text and "ci-key" not in caplog.text
        else:
            outcome = "applied"
        assert outcome == ("refused" if named else "applied"), case
        allowed = load_settings(None, **{**change, "server": {**change.get("server", {}), **ALLOW}})
        live, reloader = _reloader(running_settings, allowed)
        caplog.clear()
        await reloader.reload("test")  # said so explicitly: applied, and loudly
        assert live.settings is not running_settings
        assert bool(named) == any("SECURITY" in r.getMessage() for r in caplog.records), case
        rows.append((case, outcome, ", ".join(named) or "-"))
    print("\nreload guard: running = require_api_key, admin key, 2 tenants with keys")
    print(f"  {'new settings':<38} {'outcome':<8} {'drops':<40} with allow_reload_to_drop_security = true")
    for case, outcome, drops in rows:
        print(f"  {case:<38} {outcome:<8} {drops:<40} applied")


@pytest.mark.parametrize("text", ["", "   \n\t\n", "# all commented out\n# [server]\n# admin_key = 'x'\n"])
def test_an_empty_file_is_refused_on_reload(tmp_path: Path, text: str) -> None:
    config = tmp_path / "kvgate.toml"
    config.write_text(text)
    source = refusing_empty_file(config, functools.partial(load_settings, config))
    with pytest.raises(Exception, match=r"setting '--config' = '.*kvgate\.toml' is invalid: the file is empty"):
        source()
    config.write_text("[server]\nlog_level = 'debug'\n")
    assert source().server.log_level == "debug"


def _config(backend_url: str, body: str) -> str:
    return f'{body}\n[[backends]]\nname = "o"\nurl = "{backend_url}"\n'


SECURE_FILE = f"""
[server]
require_api_key = true
admin_key = "{ADMIN}"
[tenants.ci]
api_keys = ["ci-key"]
"""


async def _status(url: str, path: str, method: str = "GET", key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http, http.request(
        method, f"{url}{path}", json=body if method == "POST" else None, headers=headers
    ) as response:
        return response.status


@pytest.mark.parametrize("emptied", ["", "# nothing here\n"])
async def test_sighup_with_an_emptied_file_keeps_every_key(tmp_path: Path, emptied: str) -> None:
    config = tmp_path / "kvgate.toml"
    async with running(FakeLLM()) as fake:
        config.write_text(_config(fake.url, SECURE_FILE))
        async with serving_config(config) as served:
            url = served.url
            assert await _status(url, "/api/chat", "POST") == 401
            assert await _status(url, "/kvgate/status") == 403
            config.write_text(emptied)
            served.process.send_signal(signal.SIGHUP)
            line = await served.line_with("configuration reload")  # "reloaded (SIGHUP); changed: ..." or "refused"
            assert "(SIGHUP) refused" in line and "the file is empty" in line and ADMIN not in line, line
            assert await _status(url, "/api/chat", "POST") == 401  # still protected
            assert await _status(url, "/kvgate/status") == 403
            assert await _status(url, "/api/chat", "POST", "ci-key") == 200
            config.write_text(_config(fake.url, "[tenants.ci]\n"))  # not empty, but drops every key
            served.process.send_signal(signal.SIGHUP)
            line = await served.line_with("configuration reload")
            assert "(SIGHUP) refused" in line and "WARNING" in line and "SECURITY" in line
            assert "allow_reload_to_drop_security = true" in line
            assert await _status(url, "/api/chat", "POST") == 401
            config.write_text(_config(fake.url, "[server]\nallow_reload_to_drop_security = true\n"))
            served.process.send_signal(signal.SIGHUP)
            await served.line_with("configuration reloaded (SIGHUP)")
            assert await _status(url, "/api/chat", "POST") == 200  # said so explicitly: open now
            await served.stop()


async def test_a_reload_that_lets_unknown_keys_in_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """Without require_api_key, an unknown key gets a 401 while tenants have keys; a reload turning on
    tenants.anonymous.allow_unknown_keys would let every made-up key in: refused unless said so, like the others."""
    caplog.set_level(logging.INFO, logger="gateway.config.reload")
    keyed: dict[str, Any] = {"tenants": {"ci": {"api_keys": ["ci-key"]}}}
    running_settings = load_settings(None, **keyed)
    lenient = {"tenants": {**keyed["tenants"], "anonymous": {"allow_unknown_keys": True}}}
    drops = security_drops(running_settings, load_settings(None, **lenient))
    assert drops and "allow_unknown_keys" in drops[0]
    live, reloader = _reloader(running_settings, load_settings(None, **lenient))
    with pytest.raises(ReloadRefused):
        await reloader.reload("test")
    assert live.settings is running_settings
    already = load_settings(None, **lenient)  # already lenient: keeping it so is no drop
    assert security_drops(already, load_settings(None, **lenient)) == ()
    allowed = load_settings(None, **lenient, server=ALLOW)
    live, reloader = _reloader(running_settings, allowed)
    await reloader.reload("test")
    assert live.settings is not running_settings
    assert live.tenants.identify({"Authorization": "Bearer made-up"}).name == "anonymous"
