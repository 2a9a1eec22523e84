"""deploy/kubernetes/config_sync.py, the kvgate pod's init container and config-sync sidecar: it merges the
ConfigMap's kvgate.toml with the Secret's tenants.toml into the file kvgate serves with, and reloads kvgate when a
mount changes. The mounts are laid out here as the kubelet lays them out (each file a symlink through ``..data``
to a timestamped directory, replaced by an atomic symlink swap), and the reloads go to a real kvgate on
127.0.0.1."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.app import LIVE, create_app, start_server
from gateway.config.settings import load_settings, sha256_hex
from tests.deploy.test_kubernetes import KUBERNETES, load_config_sync
from tests.support.fake_backend import FakeLLM, running, serve

sync = load_config_sync()
ADMIN = "admin-key-for-config-sync-tests"


def _mount(directory: Path, version: int, files: dict[str, str]) -> None:
    """Publish ``files`` in ``directory`` as the kubelet does a ConfigMap or Secret volume's new version."""
    data = directory / f"..2026_12_03_00_00_0{version}.000000000"
    data.mkdir(parents=True)
    for name, text in files.items():
        (data / name).write_text(text)
    (directory / "..data_tmp").symlink_to(data.name)
    os.replace(directory / "..data_tmp", directory / "..data")  # the swap: every file changes at once
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(Path("..data") / name)


CONFIG = """[server]
require_api_key = true
[[backends]]
name = "gpu-a"
kind = "openai"
url = "{url}"
[tenants.ci]
max_active = {max_active}
"""
TENANTS = '[tenants.ci]\napi_keys = ["{key}"]\n'


@dataclass
class Pod:
    args: argparse.Namespace
    config: Path
    secret: Path


def _pod(root: Path, url: str) -> Pod:
    config, secret, run = root / "config", root / "secret", root / "run"
    run.mkdir()
    _mount(config, 1, {"kvgate.toml": CONFIG.format(url=url, max_active=2)})
    _mount(secret, 1, {"tenants.toml": TENANTS.format(key="ci-key-1")})
    args = sync.build_parser().parse_args([
        "watch", "--config", str(config / "kvgate.toml"), "--tenants", str(secret / "tenants.toml"),
        "--output", str(run / "kvgate.toml"), "--interval-s", "0"])
    return Pod(args, config, secret)


@pytest.fixture
async def kvgate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Pod, Any]]:
    """A kvgate serving the merged file on 127.0.0.1 (its admin key from the environment, as in the pod), and the
    pod's mounts; the init container ran."""
    monkeypatch.setenv("KVGATE_SERVER__ADMIN_KEY", ADMIN)
    async with running(FakeLLM()) as backend:
        pod = _pod(tmp_path, backend.url)
        assert sync.main(["once", "--config", str(pod.args.config), "--tenants", str(pod.args.tenants),
                          "--output", str(pod.args.output)]) == 0
        settings_now = load_settings(pod.args.output)
        app = create_app(settings_now, settings_source=lambda: load_settings(pod.args.output), refresh_models=False)
        runner, port = await start_server(app, "127.0.0.1", 0)
        pod.args.reload_url = f"http://127.0.0.1:{port}/kvgate/reload"
        try:
            yield pod, app
        finally:
            await runner.cleanup()


async def _round(pod: Pod) -> None:
    await asyncio.to_thread(sync.watch, pod.args, ADMIN, 1)


async def test_a_configmap_or_secret_update_reloads_kvgate(kvgate: tuple[Pod, Any],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    pod, app = kvgate
    live = app[LIVE]
    assert live.settings.tenants["ci"].max_active == 2
    async with aiohttp.ClientSession() as client:
        async with client.get(pod.args.reload_url.replace("reload", "health")) as reply:
            assert reply.status == 200, "the kubelet's probes send no key: require_api_key must not refuse them"
        bearer = {"Authorization": f"Bearer {ADMIN}"}  # as the ServiceMonitor scrapes
        async with client.get(pod.args.reload_url.replace("reload", "metrics"), headers=bearer) as reply:
            assert reply.status == 200 and "kvgate_config_reloads_total" in await reply.text()
    assert live.settings.tenants["ci"].digests() == [sha256_hex("ci-key-1")]
    capsys.readouterr()

    await _round(pod)  # nothing changed since the init container: no reload
    assert "reloaded" not in capsys.readouterr().err and live.reloaded_at_s is None

    _mount(pod.config, 2, {"kvgate.toml": CONFIG.format(url=live.settings.backends[0].url, max_active=3)})
    await _round(pod)
    assert '"changed": ["tenants.ci.max_active"]' in capsys.readouterr().err
    assert live.settings.tenants["ci"].max_active == 3

    _mount(pod.secret, 2, {"tenants.toml": TENANTS.format(key="ci-key-2")})  # a rotated key
    await _round(pod)
    err = capsys.readouterr().err
    assert "kvgate reloaded" in err and "ci-key" not in err
    assert live.settings.tenants["ci"].digests() == [sha256_hex("ci-key-2")]
    assert (pod.args.output.stat().st_mode & 0o077) == 0, "the merged file holds keys: its owner's only"


async def test_a_file_that_cant_be_merged_or_is_refused_keeps_kvgates_settings(
        kvgate: tuple[Pod, Any], capsys: pytest.CaptureFixture[str]) -> None:
    pod, app = kvgate
    live = app[LIVE]
    url = live.settings.backends[0].url
    written = pod.args.output.read_text()
    _mount(pod.config, 2, {"kvgate.toml": CONFIG.format(url=url, max_active=2) + 'api_keys = ["in-the-configmap"]\n'})
    await _round(pod)
    err = capsys.readouterr().err
    assert "setting 'tenants.ci.api_keys' is in both files" in err and "in-the-configmap" not in err
    assert pod.args.output.read_text() == written and live.reloaded_at_s is None

    _mount(pod.config, 3, {"kvgate.toml": CONFIG.format(url=url, max_active=0)})  # invalid: kvgate refuses it
    await _round(pod)
    err = capsys.readouterr().err
    assert "kvgate refused the reload (400)" in err and "tenants.ci.max_active" in err
    assert live.settings.tenants["ci"].max_active == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_reload_kvgate_did_not_answer_is_sent_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = _pod(tmp_path, "http://127.0.0.1:9")
    pod.args.reload_url = f"http://127.0.0.1:{_closed_port()}/kvgate/reload"
    sync.watch(pod.args, ADMIN, rounds=2)  # round 1 writes the file; kvgate is not up in either round
    err = capsys.readouterr().err
    assert err.count("wrote ") == 1 and err.count("not reached") == 2


async def test_a_not_now_answer_is_retried_and_a_refusal_is_not(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    answers = [503, 200, 400]
    seen: list[str] = []

    async def reload(request: web.Request) -> web.Response:
        seen.append(request.headers["Authorization"])
        return web.json_response({"reloaded": True}, status=answers.pop(0))

    async with serve({("POST", "/kvgate/reload"): reload}) as url:
        pod = _pod(tmp_path, "http://127.0.0.1:9")
        pod.args.reload_url = f"{url}/kvgate/reload"
        await asyncio.to_thread(sync.watch, pod.args, ADMIN, 3)  # written in round 1: 503, then 200, then quiet
        assert seen == [f"Bearer {ADMIN}"] * 2
        _mount(pod.config, 2, {"kvgate.toml": CONFIG.format(url="http://127.0.0.1:9", max_active=0)})
        await asyncio.to_thread(sync.watch, pod.args, ADMIN, 3)  # 400: final, not sent again
        assert len(seen) == 3
    err = capsys.readouterr().err
    assert "did not take the reload (503)" in err and "kvgate reloaded" in err and "refused the reload (400)" in err


def test_a_file_that_cant_be_merged_is_logged_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = _pod(tmp_path, "http://127.0.0.1:9")
    pod.args.reload_url = f"http://127.0.0.1:{_closed_port()}/kvgate/reload"
    _mount(pod.secret, 2, {"tenants.toml": "[server]\nport = 1\n"})
    sync.watch(pod.args, ADMIN, rounds=3)
    assert capsys.readouterr().err.count("may hold only [tenants.*] tables") == 1


def test_the_admin_key_goes_to_this_pods_kvgate_only() -> None:
    with pytest.raises(ValueError, match=r"is not http://127\.0\.0\.1"):
        sync.post_reload("http://kvgate.kvgate.svc:11435/kvgate/reload", ADMIN, 1.0)


def test_the_command_line_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    pod = _pod(tmp_path, "http://127.0.0.1:9")
    (pod.secret / "..data" / "tenants.toml").write_text('[server]\nadmin_key = "smuggled"\n')
    base = ["--config", str(pod.args.config), "--tenants", str(pod.args.tenants), "--output", str(pod.args.output)]
    assert sync.main(["once", *base]) == 2
    err = capsys.readouterr().err
    assert "may hold only [tenants.*] tables; move server" in err and "smuggled" not in err
    assert not pod.args.output.exists()
    (pod.secret / "..data" / "tenants.toml").write_text('[tenants.ci]\napi_keys = ["unterminated]\n')
    assert sync.main(["once", *base]) == 2
    err = capsys.readouterr().err
    assert "is not valid TOML" in err and "unterminated" not in err
    monkeypatch.delenv("KVGATE_SERVER__ADMIN_KEY", raising=False)
    assert sync.main(["watch", *base]) == 2
    assert "KVGATE_SERVER__ADMIN_KEY is not set" in capsys.readouterr().err


@pytest.mark.parametrize(("base", "extra", "merged"), [
    ({"tenants": {"ci": {"max_active": 2}}}, {"tenants": {"ci": {"api_keys": ["k"]}}},
     {"tenants": {"ci": {"max_active": 2, "api_keys": ["k"]}}}),
    ({"server": {"port": 1}}, {"tenants": {"team": {"api_keys": ["k"]}}},
     {"server": {"port": 1}, "tenants": {"team": {"api_keys": ["k"]}}}),
    ({"tenants": {}}, {}, {"tenants": {}}),
])
def test_merge_joins_tables(base: dict[str, Any], extra: dict[str, Any], merged: dict[str, Any]) -> None:
    assert sync.merge(base, extra) == merged


def test_merge_refuses_a_setting_in_both_without_showing_it() -> None:
    with pytest.raises(sync.MergeError, match=r"setting 'tenants\.ci' is in both files") as caught:
        sync.merge({"tenants": {"ci": "secret-a"}}, {"tenants": {"ci": {"api_keys": ["secret-b"]}}})
    assert "secret" not in str(caught.value)


_SCALARS = (st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
            | st.floats(allow_nan=False) | st.text(max_size=12))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _VALUES, max_size=5))
def test_dumps_writes_back_exactly_what_was_read(document: dict[str, Any]) -> None:
    assert tomllib.loads(sync.dumps(document)) == document


def test_the_kubernetes_configuration_merges_with_the_example_tenants() -> None:
    text = sync.render(KUBERNETES / "kvgate.toml", KUBERNETES / "tenants.example.toml")
    merged = tomllib.loads(text)
    assert merged["tenants"]["ci"] == {"max_prompt_tokens": 8192, "max_active": 2,
                                       "api_keys": ["example-ci-key-replace-with-openssl-rand-hex-24"]}
    assert merged["backends"][1]["url"] == "http://gpu-b.internal:8080"


def test_the_sidecar_stops_on_sigterm(tmp_path: Path) -> None:
    """As a container's PID 1 a signal it has no handler for is ignored, and the pod would wait out its whole grace
    period: the watcher ends on SIGTERM itself (exit 0, where the default action would report -15)."""
    pod = _pod(tmp_path, "http://127.0.0.1:9")
    command = [sys.executable, str(KUBERNETES / "config_sync.py"), "watch", "--config", str(pod.args.config),
               "--tenants", str(pod.args.tenants), "--output", str(pod.args.output), "--interval-s", "30",
               "--reload-url", f"http://127.0.0.1:{_closed_port()}/kvgate/reload"]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "KVGATE_SERVER__ADMIN_KEY": ADMIN}) as process:
        try:
            assert process.stderr is not None
            assert "wrote" in process.stderr.readline()  # the handler is in place before the first round
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 0
        finally:
            process.kill()
