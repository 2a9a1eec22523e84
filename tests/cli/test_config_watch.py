"""``server.watch_config_s`` (gateway/cli/config_watch.py): a real ``kvgate serve --config A --config B`` whose two
files are a ConfigMap and a Secret volume laid out as the kubelet lays them out; a new version of either, published
by the kubelet's atomic ``..data`` swap, is applied without a restart, an invalid one is refused and the running
settings stay."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.cli.config_watch import watch_files
from tests.support.fake_backend import FakeLLM, running
from tests.support.kubelet_mounts import publish
from tests.support.poll import until
from tests.support.serve_process import listening, serve_process

ADMIN = "admin-key-for-config-watch-tests"
CONFIG = """[server]
require_api_key = true
watch_config_s = 0.1
[[backends]]
name = "gpu-a"
kind = "openai"
url = "{url}"
[tenants.ci]
max_active = {max_active}
"""
TENANTS = '[tenants.ci]\napi_keys = ["{key}"]\n'


@pytest.fixture
async def pod(tmp_path: Path) -> AsyncIterator[tuple[str, str, Path, Path]]:
    """kvgate serve reading the ConfigMap's kvgate.toml and the Secret's tenants.toml; (url, backend url, config
    volume, secret volume)."""
    async with running(FakeLLM()) as backend:
        config, secret = tmp_path / "config", tmp_path / "secret"
        publish(config, 1, {"kvgate.toml": CONFIG.format(url=backend.url, max_active=2)})
        publish(secret, 1, {"tenants.toml": TENANTS.format(key="ci-key-1")})
        async with serve_process("--config", str(config / "kvgate.toml"), "--config", str(secret / "tenants.toml"),
                                 env={"KVGATE_SERVER__ADMIN_KEY": ADMIN}) as served:
            url = await listening(served)
            yield url, backend.url, config, secret


async def _status(url: str, key: str) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with aiohttp.ClientSession() as client, client.post(
            f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as reply:
        return reply.status


async def _reloads(url: str) -> str:
    async with aiohttp.ClientSession() as client, client.get(
            f"{url}/kvgate/metrics", headers={"Authorization": f"Bearer {ADMIN}"}) as reply:
        return "\n".join(line for line in (await reply.text()).splitlines()
                         if line.startswith("kvgate_config_reloads_total"))


async def test_a_configmap_or_secret_update_is_applied_without_a_restart(
    pod: tuple[str, str, Path, Path],
) -> None:
    url, backend, config, secret = pod
    assert await _status(url, "ci-key-1") == 200
    async with aiohttp.ClientSession() as client, client.get(f"{url}/kvgate/health") as health:
        assert health.status == 200, "the kubelet's probes send no key: require_api_key must not refuse them"
    publish(secret, 2, {"tenants.toml": TENANTS.format(key="ci-key-2")})  # a rotated key

    async def the_new_key_is_taken() -> bool:
        return await _status(url, "ci-key-2") == 200

    await until(the_new_key_is_taken, timeout_s=10)
    assert await _status(url, "ci-key-1") == 401
    publish(config, 2, {"kvgate.toml": CONFIG.format(url=backend, max_active=0)})  # invalid: refused

    async def a_refusal_is_counted() -> bool:
        return 'outcome="refused"} 1.0' in await _reloads(url)

    await until(a_refusal_is_counted, timeout_s=10)
    assert await _status(url, "ci-key-2") == 200  # the running settings stayed
    assert 'outcome="ok"} 1.0' in await _reloads(url)  # the key rotation, once: an unchanged file reloads nothing


async def test_the_watcher_calls_once_per_change_and_waits_out_a_file_missing_midway(tmp_path: Path) -> None:
    path = tmp_path / "kvgate.toml"
    path.write_text("[server]\n")
    changes: list[int] = []
    steps: asyncio.Queue[None] = asyncio.Queue()
    pauses: list[float] = []

    async def step(interval_s: float) -> None:  # one comparison per step the test allows
        pauses.append(interval_s)
        await steps.get()

    watching = asyncio.ensure_future(watch_files([path], 1.0, lambda: changes.append(1), sleep=step))
    await until(lambda: pauses)

    async def compare() -> None:
        """One comparison, done: the watcher is back in its pause."""
        paused = len(pauses)
        steps.put_nowait(None)
        await until(lambda: len(pauses) > paused)

    await compare()
    assert changes == []
    path.write_text("[server]\nlog_level = 'debug'\n")
    await compare()
    await compare()
    assert changes == [1]
    path.unlink()
    await compare()
    path.write_text("[server]\nlog_level = 'debug'\n")  # back as it was: no change
    await compare()
    assert changes == [1]
    watching.cancel()
    await asyncio.gather(watching, return_exceptions=True)
