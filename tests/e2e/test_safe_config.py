"""Safe configuration: empty keys, odd backend URLs and missing files stop start-up naming the setting and never
echoing a secret; misspelled variables are reported; an address or directory kvgate can't use is one line and an
exit code; listening beyond loopback unprotected is loud; model management needs the admin key."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.app import create_app, start_server
from gateway.cli.main import EXIT_ADDRESS_IN_USE, EXIT_CACHE_DIR, EXIT_HOST_UNRESOLVABLE, main
from gateway.config.settings import ConfigError, load_settings, unknown_environment
from tests.support.fake_backend import FakeLLM, running
from tests.support.serve_process import serve_process

SECRET = "s3cret-Do-Not-Echo"

BACKEND = '[[backends]]\nname = "b"\nurl = "http://127.0.0.1:11434"\n'


@pytest.mark.parametrize(
    ("toml", "setting"),
    [
        ('[server]\nadmin_key = ""\n', "server.admin_key"),
        ('[server]\nadmin_key = "   "\n', "server.admin_key"),
        ("[server]\nadmin_key = 8675309123\n", "server.admin_key"),
        (f'[server]\nadmin_key = ["{SECRET}"]\n', "server.admin_key"),
        (f'[server]\nadmn_key = "{SECRET}"\n', "server.admn_key"),
        ('[tenants.ci]\napi_keys = [""]\n', "tenants.ci.api_keys"),
        (f'[tenants.ci]\napi_keys = ["{SECRET}", " \\t"]\n', "tenants.ci.api_keys"),
        (f'[tenants.ci]\napi_keys = ["{SECRET}\\n"]\n', "tenants.ci.api_keys"),
        (f'[tenants.ci]\napi_keys = "{SECRET}"\n', "tenants.ci.api_keys"),
        (f'[tenants]\nci = "{SECRET}"\n', "tenants.ci"),
        (f'[server]\nadmin_key = "{SECRET}"\n[tenants.ci]\napi_keys = ["{SECRET}"]\n', "server.admin_key"),
        ('[[backends]]\nname = "b"\napi_key = ""\n', "backends.0.api_key"),
        (f'[[backends]]\nname = "b"\napi_key = "{SECRET} "\n', "backends.0.api_key"),
        ('[[backends]]\nname = "b"\nurl = "http://127.0.0.1:11434/v1"\n', "backends.0.url"),
        ('[[backends]]\nname = "b"\nurl = "http://127.0.0.1:11434/?x=1"\n', "backends.0.url"),
        ('[[backends]]\nname = "b"\nurl = "http://127.0.0.1:11434#top"\n', "backends.0.url"),
        (f'[[backends]]\nname = "b"\nurl = "http://user:{SECRET}@127.0.0.1:11434/api"\n', "backends.0.url"),
        ('[[backends]]\nname = "b"\nkind = "llama-server"\ngguf_path = "/no/such/model.gguf"\n',
         "backends.0.gguf_path"),
        (BACKEND + '[models."m"]\ngguf_path = "/no/such/m.gguf"\n', "models.m.gguf_path"),
        (BACKEND + '[models."m"]\ntokenizer_json = "/no/such/tokenizer.json"\n', "models.m.tokenizer_json"),
    ],
)
def test_bad_configuration_is_refused_naming_the_setting_without_its_secret(
    toml: str, setting: str, tmp_path: Path
) -> None:
    path = tmp_path / "kvgate.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert f"setting '{setting}'" in message or f"{setting} " in message, message
    assert SECRET not in message and "8675309123" not in message, message


def test_an_unset_variable_in_the_environment_is_an_empty_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_SERVER__ADMIN_KEY", "")
    with pytest.raises(ConfigError, match=r"setting 'server.admin_key' is invalid: .*empty"):
        load_settings()


def test_a_backend_url_with_a_password_is_masked_in_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, backends=[{"name": "b", "url": f"ftp://user:{SECRET}@h:1"}])
    assert "ftp://user:****@h:1" in str(caught.value) and SECRET not in str(caught.value)


def test_misspelled_environment_variables_name_the_closest_setting() -> None:
    environ = {
        "KVGATE_SERVR__PORT": "8080", "kvgate_server__admin_kee": SECRET, "KVGATE_NOTHING_LIKE_IT": "1",
        "KVGATE_SERVER__PORT": "8080", "KVGATE_TENANTS__ci__API_KEYS": "[]", "KVGATE_CACHE": "/tmp", "HOME": "/",
    }
    lines = unknown_environment(environ)
    assert lines == [
        "environment variable KVGATE_NOTHING_LIKE_IT names no kvgate setting; see config/kvgate.toml for the settings",
        "environment variable KVGATE_SERVR__PORT names no kvgate setting; did you mean KVGATE_SERVER__PORT?",
        "environment variable kvgate_server__admin_kee names no kvgate setting; did you mean "
        "KVGATE_SERVER__ADMIN_KEY?",
    ]
    assert not any(SECRET in line for line in lines)


def test_a_misspelled_variable_is_named_when_start_up_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVGATE_SERVER__PRT", "8080")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "setting 'server.prt' is invalid" in err
    assert "KVGATE_SERVER__PRT names no kvgate setting; did you mean KVGATE_SERVER__PORT?" in err


async def _serve(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", *args, stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )
    try:
        _, err = await asyncio.wait_for(process.communicate(), timeout=30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_a_busy_port_is_one_line_and_an_exit_code() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = await _serve("--port", str(port), "--backend", "http://127.0.0.1:9")
    assert code == EXIT_ADDRESS_IN_USE
    assert err.splitlines() == [f"kvgate: can't listen on 127.0.0.1:{port}: the port is already in use (another "
                                "kvgate or server?); stop it or set another server.port"]


async def test_an_unresolvable_host_is_one_line_and_an_exit_code() -> None:
    code, err = await _serve("--host", "no-such-host.invalid", "--port", "0")
    assert code == EXIT_HOST_UNRESOLVABLE
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("kvgate: setting 'server.host' = 'no-such-host.invalid' does not resolve"), err


async def test_an_unwritable_cache_dir_is_one_line_and_an_exit_code(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, err = await _serve("--port", "0", env={"KVGATE_COUNTING__CACHE_DIR": str(blocker / "tokenizers")})
    assert code == EXIT_CACHE_DIR
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"kvgate: setting 'counting.cache_dir' = '{blocker / 'tokenizers'}' is unusable"), err


async def test_serve_warns_about_a_misspelled_variable_at_start_up(tmp_path: Path) -> None:
    async with running(FakeLLM()) as fake:
        env = {"KVGATE_SERVR__PORT": "8080", "KVGATE_COUNTING__CACHE_DIR": str(tmp_path / "cache")}
        async with serve_process("--backend", f"ollama={fake.url}", env=env) as served:
            process, stderr = served.process, served.stderr
            lines: list[str] = []
            while not lines or "listening on" not in lines[-1]:
                lines.append((await asyncio.wait_for(stderr.readline(), timeout=20)).decode())
                assert lines[-1], lines
            assert any(re.search(r"WARNING .*KVGATE_SERVR__PORT names no kvgate setting; did you mean "
                                 r"KVGATE_SERVER__PORT\?", line) for line in lines), lines
            assert (tmp_path / "cache").is_dir()
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), timeout=10) == 0


@pytest.mark.parametrize(
    ("server", "tenants", "loud"),
    [
        ({"host": "0.0.0.0"}, {}, True),
        ({"host": "::"}, {}, True),
        ({"host": "192.0.2.10"}, {}, True),
        ({"host": "127.0.0.1"}, {}, False),
        ({"host": "localhost"}, {}, False),
        ({"host": "::1"}, {}, False),
        ({"host": "0.0.0.0", "admin_key": SECRET}, {}, False),
        ({"host": "0.0.0.0", "require_api_key": True}, {"ci": {"api_keys": ["k-1"]}}, False),
    ],
)
def test_listening_beyond_loopback_unprotected_is_a_loud_warning(
    server: dict[str, object], tenants: dict[str, object], loud: bool, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(None, server=server, tenants=tenants)
    with caplog.at_level(logging.WARNING, logger="gateway.edge.admin_access"):
        create_app(settings, refresh_models=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "SECURITY" in r.getMessage()]
    assert bool(warnings) == loud, warnings
    if loud:
        assert "no tenant API keys and no server.admin_key" in warnings[0]
    assert not any(SECRET in r.getMessage() for r in caplog.records)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MANAGEMENT = [
    ("POST", "/api/pull", b'{"model": "llama3.1:8b"}'),
    ("POST", "/api/push", b'{"model": "me/m"}'),
    ("POST", "/api/create", b'{"model": "m", "from": "llama3.1:8b"}'),
    ("POST", "/api/copy", b'{"source": "a", "destination": "b"}'),
    ("DELETE", "/api/delete", b'{"model": "a"}'),
    ("POST", "/api/blobs/sha256:abc", b"blob bytes"),
    ("HEAD", "/api/blobs/sha256:abc", b""),
]


async def _gateway(fake: FakeLLM, server: dict[str, object], remote: str | None = None) -> tuple[web.AppRunner, str]:
    app = create_app(load_settings(None, backends=[{"name": "o", "url": fake.url}], server=server),
                     refresh_models=False)
    if remote is not None:  # every client seen as coming from another machine
        @web.middleware
        async def from_elsewhere(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await handler(request.clone(remote=remote))

        app.middlewares.insert(0, from_elsewhere)
    runner, port = await start_server(app, "127.0.0.1", 0)
    return runner, f"http://127.0.0.1:{port}"


async def test_management_needs_the_admin_key_and_it_is_not_forwarded() -> None:
    async with running(FakeLLM()) as fake:
        runner, url = await _gateway(fake, {"admin_key": SECRET})
        try:
            async with aiohttp.ClientSession() as http:
                for method, path, body in MANAGEMENT:
                    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": SECRET}):
                        async with http.request(method, url + path, data=body, headers=headers) as response:
                            assert response.status == 403, (method, path, headers)
                            if method != "HEAD":
                                error = (await response.json())["error"]
                                assert isinstance(error, str) and "admin key" in error  # Ollama's format
                    assert not [s for s in fake.seen if (s.method, s.path_qs) == (method, path)]
                    auth = {"Authorization": f"Bearer {SECRET}"}
                    async with http.request(method, url + path, data=body, headers=auth) as response:
                        assert response.status in (200, 201), (method, path)
                    forwarded = [s for s in fake.seen if (s.method, s.path_qs) == (method, path)]
                    assert len(forwarded) == 1 and forwarded[0].body == body
                    assert "Authorization" not in forwarded[0].headers
                async with http.post(url + "/api/chat", data=b'{"model": "llama3.1:8b", "stream": false, '
                                                             b'"messages": []}') as response:
                    assert response.status == 200  # other routes are not the admin's
        finally:
            await runner.cleanup()


async def test_without_an_admin_key_management_is_for_this_machine_only() -> None:
    async with running(FakeLLM()) as fake, aiohttp.ClientSession() as http:
        local, local_url = await _gateway(fake, {})
        try:
            async with http.post(local_url + "/api/pull", data=b"{}") as response:
                assert response.status == 200
        finally:
            await local.cleanup()
        remote, remote_url = await _gateway(fake, {}, remote="192.0.2.7")
        try:
            async with http.post(remote_url + "/api/pull", data=b"{}") as response:
                assert response.status == 403
                assert "only clients on kvgate's own machine" in (await response.json())["error"]
            async with http.get(remote_url + "/api/tags") as response:
                assert response.status == 200
        finally:
            await remote.cleanup()
        opened, opened_url = await _gateway(fake, {"admin_only_management": False}, remote="192.0.2.7")
        try:
            async with http.post(opened_url + "/api/pull", data=b"{}") as response:
                assert response.status == 200
        finally:
            await opened.cleanup()


LLAMA_SERVER_STATE = [
    ("POST", "/slots/0?action=erase", b""),
    ("POST", "/slots/1?action=restore", b'{"filename": "other-tenant.bin"}'),
    ("POST", "/slots/1?action=save", b'{"filename": "x.bin"}'),
    ("POST", "/props", b"{}"),
    ("POST", "/lora-adapters", b'[{"id": 0, "scale": 1.0}]'),
    ("POST", "/models/load", b'{"model": "other"}'),
    ("POST", "/models/unload", b'{"model": "llama3.1:8b"}'),
]


async def test_llama_servers_state_changing_routes_need_the_admin_key() -> None:
    """A tenant that could erase a slot (other tenants' prompt caches) or restore one from a file (KV cells that no
    reservation counts) would undo what kvgate keeps; these go only with the admin key. Reading them does not."""
    rows = []
    async with running(FakeLLM()) as fake, aiohttp.ClientSession() as http:
        app = create_app(load_settings(None, backends=[{"name": "ls", "kind": "llama-server", "url": fake.url}],
                                       server={"admin_key": SECRET}), refresh_models=False)
        runner, port = await start_server(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        try:
            for method, path, body in LLAMA_SERVER_STATE:
                async with http.request(method, url + path, data=body) as response:
                    refused = response.status
                    error = (await response.json())["error"]
                    assert error["type"] == "permission_error" and error["code"] == 403  # llama-server's format
                    assert "admin key" in error["message"]
                forwarded_before = len([s for s in fake.seen if s.path_qs == path])
                auth = {"Authorization": f"Bearer {SECRET}"}
                async with http.request(method, url + path, data=body, headers=auth) as response:
                    admitted = response.status
                forwarded = [s for s in fake.seen if s.path_qs == path]
                rows.append(f"  {method} {path:<26} no key -> {refused}, admin key -> {admitted} (forwarded "
                            f"{len(forwarded)})")
                assert (refused, forwarded_before, len(forwarded)) == (403, 0, 1)
                assert "Authorization" not in forwarded[0].headers
            for path in ("/props", "/slots", "/lora-adapters"):
                async with http.get(url + path) as response:
                    rows.append(f"  GET {path:<30} no key -> {response.status}")
                    assert response.status == 200
        finally:
            await runner.cleanup()
    print("\n" + "\n".join(rows))
