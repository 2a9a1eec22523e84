"""Passwords in backend URLs and the Redis URL are masked everywhere, and still used (issue 23, point 5).

The attack (an operator's mistake an attacker reads): a backend URL with a password, or a bad ``redis_url``, printed
whole in the start-up line, ``/kvgate/status`` (JSON and page), a config error, an error message a client gets,
the request's log line and ``kvgate check``'s output. Each place is checked for the password; the backend must still
get the credentials (as Basic auth), even when the client sends an ``Authorization`` header of its own.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import signal
import sys

import aiohttp
import pytest

from gateway.app import create_app, start_server
from gateway.config.settings import ConfigError, load_settings
from gateway.support.redact import mask_url
from tests.support.fake_backend import FakeLLM, running

SECRET = "hunter2-Do-Not-Echo"
BASIC = "Basic " + base64.b64encode(f"ops:{SECRET}".encode()).decode()


def _with_password(url: str) -> str:
    return url.replace("http://", f"http://ops:{SECRET}@")


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("http://ops:pw@h:1", "http://ops:****@h:1"),
        ("redis://:pw@h:6379/0", "redis://:****@h:6379/0"),
        ("rediss://user:pw@h/1?ssl_cert_reqs=none", "rediss://user:****@h/1?ssl_cert_reqs=none"),
        ("redis://h:6379/0?password=pw&db=1", "redis://h:6379/0?password=****&db=1"),
        ("unix://:pw@/run/redis.sock?db=0", "unix://:****@/run/redis.sock?db=0"),
        ("http://h:1", "http://h:1"),
        ("not a url at all", "not a url at all"),
        ("http://ops:pw@h:notaport", "http://ops:****@h:notaport"),
        ("http://ops:p/w@x@h:1", "http://ops:****@h:1"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize(
    "settings",
    [
        {"shared_ledger": {"redis_url": f"http://user:{SECRET}@h:1"}},
        {"shared_ledger": {"redis_url": f"redis:/x:{SECRET}@h:1"}},
        {"shared_ledger": {"redis_url": f"htp://h:1/?password={SECRET}"}},
        {"backends": [{"name": "b", "url": f"http://user:{SECRET}@h:1/v1"}]},
        {"backends": [{"name": "b", "url": f"ftp://user:{SECRET}@h:notaport"}]},
        {"backends": [{"name": "b", "url": f"http://user:a/{SECRET}@h:1"}]},
        {"backends": [{"name": "b", "url": f"http://user:{SECRET}@h:1", "api_key": "k-1"}]},
    ],
)
def test_config_errors_never_print_a_password(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, **settings)
    message = str(caught.value)
    assert SECRET not in message, message
    print(f"\n  {message}")


async def test_a_backend_password_is_used_and_shown_nowhere(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    async with running(FakeLLM()) as fake:
        settings = load_settings(None, backends=[{"name": "o", "url": _with_password(fake.url)}])
        assert SECRET not in repr(settings) and SECRET not in str(settings)
        app = create_app(settings)
        runner, port = await start_server(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                chat = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
                for headers in ({}, {"Authorization": "Bearer the-clients-own"}):
                    async with http.post(f"{url}/api/chat", json=chat, headers=headers) as response:
                        assert response.status == 200, await response.text()
                async with http.post(f"{url}/api/chat", json={**chat, "model": "no-such-model"}) as response:
                    missing = await response.text()  # names the backend: "not found on backend 'o' at ..."
                async with http.get(f"{url}/kvgate/status") as response:
                    status = await response.text()
                async with http.get(f"{url}/kvgate/status", headers={"Accept": "text/html"}) as response:
                    page = await response.text()
        finally:
            await runner.cleanup()
    chats = [seen for seen in fake.seen if seen.path_qs == "/api/chat"]
    assert len(chats) >= 2 and all(seen.headers.get("Authorization") == BASIC for seen in chats[:2])
    listings = [seen for seen in fake.seen if seen.path_qs == "/api/tags"]
    assert listings and all(seen.headers.get("Authorization") == BASIC for seen in listings)
    assert "ops:****@127.0.0.1" in status and "at http://ops:****@127.0.0.1" in missing, missing
    for where, text in (("error", missing), ("status", status), ("page", page), ("log", caplog.text)):
        assert SECRET not in text, where


async def _serve_stderr(*args: str) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "KVGATE_COUNTING__CACHE_DIR": os.environ.get("TMPDIR", "/tmp") + "/kvgate-url-secrets-cache"}
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "serve", "--port", "0", *args,
                                                   stderr=asyncio.subprocess.PIPE, env=env)
    assert process.stderr is not None
    try:
        first = await asyncio.wait_for(process.stderr.readline(), timeout=20)
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=10)
        return (first + await process.stderr.read()).decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_the_start_up_line_masks_the_password() -> None:
    async with running(FakeLLM()) as fake:
        stderr = await _serve_stderr("--backend", f"ollama={_with_password(fake.url)}")
    assert re.search(r"listening on http://127\.0\.0\.1:\d+; backends: ollama \(ollama\) http://ops:\*\*\*\*@", stderr)
    assert SECRET not in stderr


async def test_kvgate_check_masks_the_password() -> None:
    async with running(FakeLLM()) as fake:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "check", "--backend", f"ollama={_with_password(fake.url)}",
            "--gateway", f"http://admin:{SECRET}@127.0.0.1:9", "--json", "--vram", "24GiB",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    out = (stdout + stderr).decode()
    assert "could not read http://admin:****@127.0.0.1:9/kvgate/status" in out, out
    assert SECRET not in out, out
