"""Reload without a restart (gateway/config/reload.py): ``POST /kvgate/reload`` and ``SIGHUP`` re-read
the configuration; tenants, caps and policies change for new requests, in-flight requests keep their reservations, a
bad file is refused naming the setting and the running settings stay."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.admission.rates import RateLimit, RateLimiter
from gateway.admission.tenant_keys import TenantDirectory
from gateway.app import ADMITTER, LIVE, create_app, start_server
from gateway.config.reload import LiveSettings, Reloader, ReloadRefused, plan_reload
from gateway.config.settings import ConfigError, Settings, load_settings
from tests.support.exact_count import exact_counting
from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.poll import until
from tests.support.serve_process import serving_config

ADMIN = "admin-secret-key"
CHAT = {"model": "llama3.1:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
LONG_CHAT = {**CHAT, "messages": [{"role": "user", "content": "word " * 300}]}
SECRETS = ("ci-key", "team-key", "ops-key", ADMIN, "admin-rotated-key")
EXACT = exact_counting("llama3.1:8b")
"""A tenant's prompt cap applies to a real count: the model is counted with its vocabulary (an estimate never
refuses)."""


def _config(backend_url: str, tenants: str, *, extra: str = "", admin_key: str = ADMIN) -> str:
    return f"""
[server]
require_api_key = true
admin_key = "{admin_key}"
{extra}
[counting]
cache_dir = "{EXACT["counting"]["cache_dir"]}"
count_budget_s = 30.0
[models."llama3.1:8b"]
gguf_path = "{EXACT["models"]["llama3.1:8b"]["gguf_path"]}"
[[backends]]
name = "vllm"
kind = "openai"
url = "{backend_url}"
parallel = 2
context_tokens = 4096
{tenants}
"""


TENANTS = """
[tenants.ci]
api_keys = ["ci-key"]
max_prompt_tokens = 1000
[tenants.team]
api_keys = ["team-key"]
"""


@dataclass
class Gateway:
    url: str
    app: web.Application
    config: Path
    fake: FakeLLM

    def write(self, tenants: str, **kwargs: Any) -> None:
        self.config.write_text(_config(self.fake.url, tenants, **kwargs))


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    config = tmp_path / "kvgate.toml"
    async with running(FakeLLM(Script(chunks=2))) as fake:
        config.write_text(_config(fake.url, TENANTS))
        app = create_app(load_settings(config), refresh_models=False,
                         settings_source=functools.partial(load_settings, config))
        runner, port = await start_server(app, "127.0.0.1", 0)
        try:
            yield Gateway(f"http://127.0.0.1:{port}", app, config, fake)
        finally:
            await runner.cleanup()


async def _chat(url: str, key: str, body: dict[str, Any] = CHAT) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        return response.status, orjson.loads(await response.read())


async def _reload(url: str, key: str | None = ADMIN) -> tuple[int, Any, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/kvgate/reload", headers=headers) as response:
        text = await response.text()
        return response.status, orjson.loads(text), text


async def _admin_get(url: str, path: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(
        f"{url}{path}", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as response:
        assert response.status == 200
        return await response.text()


def _no_secrets(text: str) -> None:
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, leaked


async def test_tenants_and_caps_change_for_new_requests(gateway: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.config.reload")
    url = gateway.url
    assert (await _chat(url, "ci-key", LONG_CHAT))[0] == 200
    assert (await _chat(url, "team-key"))[0] == 200
    gateway.write("""
[tenants.ci]
api_keys = ["ci-key"]
max_prompt_tokens = 50
[tenants.ops]
api_keys = ["ops-key"]
""")
    status, body, text = await _reload(url)
    assert status == 200, body
    assert body == {"reloaded": True, "changed": ["tenants.ci.max_prompt_tokens", "tenants.team", "tenants.ops"],
                    "needs_restart": []}
    status, refused = await _chat(url, "ci-key", LONG_CHAT)
    assert status == 400 and "tenant 'ci' allows 50" in refused["error"]["message"]
    assert (await _chat(url, "ci-key"))[0] == 200  # a short prompt still passes the new cap
    assert (await _chat(url, "ops-key"))[0] == 200  # a key added
    status, unknown = await _chat(url, "team-key")  # a key removed
    assert status == 401 and unknown["error"]["type"] == "authentication_error"
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "configuration reloaded (POST /kvgate/reload); changed: tenants.ci.max_prompt_tokens" in logged
    _no_secrets(text + logged)
    metrics = await _admin_get(url, "/kvgate/metrics")
    assert 'kvgate_config_reloads_total{outcome="ok"} 1.0' in metrics
    assert 'kvgate_config_reloads_total{outcome="refused"} 0.0' in metrics


async def test_an_in_flight_request_keeps_its_reservation(gateway: Gateway) -> None:
    fake = gateway.fake
    fake.script.hold_after_chunks = 1  # the stream stays open until released
    ledger = gateway.app[ADMITTER].room.ledger
    async with aiohttp.ClientSession() as http:
        body = {**CHAT, "stream": True}
        held = asyncio.ensure_future(http.post(f"{gateway.url}/v1/chat/completions", json=body,
                                               headers={"Authorization": "Bearer ci-key"}))
        await until(lambda: ledger.keys())
        (key,) = ledger.keys()
        (reservation,) = ledger.reservations(key)
        before = ledger.snapshot(key)
        # ci is removed altogether and the queue policy changes: the admitted request is not touched
        gateway.write('[tenants.ops]\napi_keys = ["ops-key"]\n', extra="[admission]\nmax_queue = 1")
        status, report, _ = await _reload(gateway.url)
        assert status == 200 and report["changed"] == ["admission.max_queue", "tenants.ci", "tenants.team",
                                                        "tenants.ops"]
        assert ledger.is_live(reservation) and ledger.snapshot(key) == before
        assert (await _chat(gateway.url, "ci-key"))[0] == 401  # new requests: ci is gone
        fake.script.release.set()
        response = await held
        assert response.status == 200
        await response.read()
        response.release()
    await until(lambda: not ledger.keys())
    assert not ledger.is_live(reservation)
    assert ledger.release(reservation) is False  # it was released, once: a second release finds nothing
    ledger.check_invariants()
    assert (await _chat(gateway.url, "ops-key"))[0] == 200


BAD_FILES = {
    "a negative cap": ('[tenants.ci]\napi_keys = ["ci-key"]\nmax_active = -3\n', "tenants.ci.max_active"),
    "an unknown field": ('[tenants.ci]\napi_keys = ["ci-key"]\nmax_activ = 3\n', "tenants.ci.max_activ"),
    "invalid TOML": ('[tenants.ci\napi_keys = ["ci-key"]\n', "--config"),
    "a key in two tenants": ('[tenants.ci]\napi_keys = ["ci-key"]\n[tenants.x]\napi_keys = ["ci-key"]\n', None),
}


@pytest.mark.parametrize("case", BAD_FILES)
async def test_a_bad_file_is_refused_naming_the_setting_and_the_old_settings_stay(
    gateway: Gateway, case: str, caplog: pytest.LogCaptureFixture,
) -> None:
    tenants, param = BAD_FILES[case]
    before = gateway.app[LIVE].settings
    if case == "invalid TOML":
        gateway.config.write_text(gateway.config.read_text().replace("[tenants.team]", "[tenants.team"))
    else:
        gateway.write(tenants)
    status, body, text = await _reload(gateway.url)
    assert status == 400, body
    error = body["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_config"
    assert error["param"] == param
    if param is not None:
        assert f"setting '{param}'" in error["message"]
    else:
        assert "more than one tenant" in error["message"]
    assert gateway.app[LIVE].settings is before
    assert (await _chat(gateway.url, "team-key"))[0] == 200  # the old tenants still run
    assert (await _chat(gateway.url, "ci-key", LONG_CHAT))[0] == 200  # under their old caps
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "gateway.config.reload")
    assert "configuration reload (POST /kvgate/reload) refused, the running settings stay" in logged
    _no_secrets(text + logged)
    assert 'kvgate_config_reloads_total{outcome="refused"} 1.0' in await _admin_get(gateway.url, "/kvgate/metrics")


async def test_a_missing_file_is_refused(gateway: Gateway) -> None:
    gateway.config.unlink()
    status, body, _ = await _reload(gateway.url)
    assert status == 400 and body["error"]["param"] == "--config" and "no such file" in body["error"]["message"]
    assert (await _chat(gateway.url, "ci-key"))[0] == 200


async def test_reload_is_for_the_admin_and_the_admin_key_can_be_rotated(gateway: Gateway) -> None:
    for key in (None, "ci-key", "wrong"):
        status, body, _ = await _reload(gateway.url, key)
        assert status == 403 and body["error"]["code"] == "admin_only"
    gateway.write(TENANTS, admin_key="admin-rotated-key")
    status, body, text = await _reload(gateway.url)
    assert status == 200 and body["changed"] == ["server.admin_key"]
    _no_secrets(text)
    assert (await _reload(gateway.url, ADMIN))[0] == 403  # the old key no longer opens it
    assert (await _reload(gateway.url, "admin-rotated-key"))[0] == 200


async def test_restart_only_settings_are_named_and_keep_their_running_values(gateway: Gateway) -> None:
    gateway.write(TENANTS.replace("max_prompt_tokens = 1000", "max_prompt_tokens = 900"),
                  extra="port = 1\nmax_body_bytes = 1000\n[admission]\npool_refresh_s = 9.0\nqueue_timeout_s = 7.0")
    gateway.config.write_text(gateway.config.read_text().replace(gateway.fake.url, "http://127.0.0.1:9"))
    status, body, _ = await _reload(gateway.url)
    assert status == 200
    assert body["changed"] == ["admission.queue_timeout_s", "tenants.ci.max_prompt_tokens"]
    assert body["needs_restart"] == ["server.port", "server.max_body_bytes", "backends.vllm.url",
                                     "admission.pool_refresh_s"]
    live = gateway.app[LIVE].settings
    assert live.admission.queue_timeout_s == 7.0 and live.admission.pool_refresh_s == 5.0
    assert live.backends[0].url == gateway.fake.url and live.server.port != 1
    assert (await _chat(gateway.url, "ci-key"))[0] == 200  # still the old backend
    status_page = orjson.loads(await _admin_get(gateway.url, "/kvgate/status"))
    assert status_page["config"]["needs_restart"] == body["needs_restart"]
    assert abs(status_page["config"]["reloaded_at_s"] - time.time()) < 60
    again = (await _reload(gateway.url))[1]  # named again while the file and the process disagree
    assert again == {"reloaded": True, "changed": [], "needs_restart": body["needs_restart"]}


async def test_an_app_without_a_source_refuses_to_reload() -> None:
    async with running(FakeLLM()) as fake:
        app = create_app(load_settings(None, backends=[{"name": "b", "url": fake.url}]), refresh_models=False)
        runner, port = await start_server(app, "127.0.0.1", 0)
        try:
            status, body, _ = await _reload(f"http://127.0.0.1:{port}", None)
        finally:
            await runner.cleanup()
    assert status == 400 and "started without a configuration to re-read" in body["error"]["message"]


async def test_reloads_run_one_at_a_time() -> None:
    settings = load_settings(None)
    inside = 0
    most = 0
    lock = threading.Lock()

    def slow_source() -> Settings:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.05)  # a slow source: the reloads overlap unless they are serialized
        with lock:
            inside -= 1
        return load_settings(None, tenants={"t": {"max_active": 2}})

    reloader = Reloader(LiveSettings(settings, directory=TenantDirectory), slow_source)
    reports = await asyncio.gather(*(reloader.reload("test") for _ in range(4)))
    assert most == 1
    assert [report.changed for report in reports] == [("tenants.t",), (), (), ()]


def test_rate_buckets_survive_a_reload() -> None:
    limiter = RateLimiter()
    old, new = RateLimit(tokens_per_minute=600), RateLimit(tokens_per_minute=300)
    assert limiter.take("ci", old, 500, 0.0) is None  # 500 used
    limiter.retain({"ci": new, "gone": old})
    refused = limiter.take("ci", new, 200, 0.0)  # the new rate: the 500 used stay used, 200 over it
    assert refused is not None and refused.retry_after_s == pytest.approx(80.0)  # 400 more at 5 per second
    assert limiter.take("ci", new, 200, 80.0) is None
    limiter.settle("ci", old, 50, 80.0)  # an in-flight request, read under the old rate, settles into the bucket
    assert limiter.take("ci", new, 1, 80.0) is not None
    limiter.retain({})  # the tenant is gone: its buckets too; back, it starts full
    assert limiter.take("ci", new, 300, 80.0) is None


RELOAD_MATRIX: dict[str, tuple[dict[str, Any], str]] = {
    "tenants.ci.max_active": ({"tenants": {"ci": {"api_keys": ["k"], "max_active": 1}}}, "live"),
    "tenants.ci.weight": ({"tenants": {"ci": {"api_keys": ["k"], "weight": 3.0}}}, "live"),
    "tenants.ci.api_keys": ({"tenants": {"ci": {"api_keys": ["k2"]}}}, "live"),
    "tenants.new": ({"tenants": {"ci": {"api_keys": ["k"]}, "new": {}}}, "live"),
    "server.admin_key": ({"server": {"admin_key": "a2"}}, "live"),
    "server.require_api_key": ({"server": {"require_api_key": True}}, "live"),
    "admission.max_queue": ({"admission": {"max_queue": 1}}, "live"),
    "admission.on_too_long": ({"admission": {"on_too_long": "reject"}}, "live"),
    "fitting.remedies": ({"fitting": {"remedies": ["refuse"]}}, "live"),
    "models.m.fitting.strict": ({"models": {"m": {"fitting": {"strict": True}}}}, "live"),
    "server.port": ({"server": {"port": 1}}, "needs restart"),
    "server.log_level": ({"server": {"log_level": "debug"}}, "needs restart"),
    "backends.b.url": ({"backends": [{"name": "b", "url": "http://127.0.0.1:2"}]}, "needs restart"),
    "backends.c": ({"backends": [{"name": "b", "url": "http://127.0.0.1:1"}, {"name": "c"}]}, "needs restart"),
    "admission.pool_refresh_s": ({"admission": {"pool_refresh_s": 1.0}}, "needs restart"),
    "counting.count_budget_s": ({"counting": {"count_budget_s": 1.0}}, "needs restart"),
    "residency.headroom_bytes": ({"residency": {"headroom_bytes": 1}}, "needs restart"),
    "fitting.summary_cache_entries": ({"fitting": {"summary_cache_entries": 1}}, "needs restart"),
    "models.m.pin": ({"models": {"m": {"pin": True}}}, "needs restart"),
    "models.other": ({"models": {"m": {}, "other": {}}}, "needs restart"),
}
BASE: dict[str, Any] = {"backends": [{"name": "b", "url": "http://127.0.0.1:1"}],
                        "tenants": {"ci": {"api_keys": ["k"]}}, "server": {"admin_key": "a1"}, "models": {"m": {}}}


def _merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for section, value in change.items():
        merged[section] = {**base[section], **value} if section == "server" else value
    return merged


def test_the_reload_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    running = load_settings(None, **BASE)
    rows = []
    for field, (change, expected) in RELOAD_MATRIX.items():
        effective, report = plan_reload(running, load_settings(None, **_merged(BASE, change)))
        outcome = "live" if report.changed == (field,) and not report.needs_restart else \
            "needs restart" if report.needs_restart == (field,) and not report.changed else f"{report}"
        rows.append((field, outcome))
        assert outcome == expected, (field, report)
        assert plan_reload(effective, load_settings(None, **_merged(BASE, change)))[1].changed == ()
    with capsys.disabled():
        print("\nreload matrix: setting changed -> outcome")
        for field, outcome in rows:
            print(f"  {field:<32} {outcome}")
        for case, (_, param) in BAD_FILES.items():
            print(f"  {case:<32} refused (400 invalid_config, param {param})")


def test_refusals_name_the_setting_without_its_value() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, tenants={"ci": {"api_keys": ["secret-value"], "max_active": -3}})
    refused = ReloadRefused.from_config_error(caught.value)
    assert refused.param == "tenants.ci.max_active" and "secret-value" not in refused.message


async def test_sighup_reloads_a_running_serve(tmp_path: Path) -> None:
    config = tmp_path / "kvgate.toml"
    async with running(FakeLLM()) as fake:
        one_tenant = '[tenants.ci]\napi_keys = ["ci-key"]\n'
        config.write_text(_config(fake.url, one_tenant))
        async with serving_config(config) as served:
            url = served.url
            assert (await _chat(url, "ops-key"))[0] == 401
            config.write_text(_config(fake.url, one_tenant + '[tenants.ops]\napi_keys = ["ops-key"]\n'))
            served.process.send_signal(signal.SIGHUP)
            line = await served.line_with("configuration reloaded")
            assert "(SIGHUP); changed: tenants.ops" in line and "INFO" in line
            assert (await _chat(url, "ops-key"))[0] == 200
            config.write_text(_config(fake.url, one_tenant + "max_active = -3\n"))
            served.process.send_signal(signal.SIGHUP)
            line = await served.line_with("configuration reload (SIGHUP) refused")
            assert "ERROR" in line and "setting 'tenants.ci.max_active'" in line
            _no_secrets(line)
            assert (await _chat(url, "ops-key"))[0] == 200  # the settings of the last good reload stay
            await served.stop()
