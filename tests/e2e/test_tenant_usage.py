"""Usage per tenant: what two tenants sent (plain and streamed, Ollama and OpenAI), what the backend reported and
what kvgate refused agree between ``GET /kvgate/tenants`` and the ``kvgate_tenant_*`` metrics."""

from __future__ import annotations

from collections import Counter
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.admission.rejections import AdmissionRejected, client_closed, queue_full
from gateway.admission.types import PoolKey
from gateway.errors import BadRequest, InvalidField, LoadRefused, Unauthorized
from gateway.observability.tenant_usage import TenantUsage, refusal_reason
from tests.support.exact_count import exact_counting
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

ADMIN = {"Authorization": "Bearer s3cret-admin"}
TENANTS = {
    "a": {"api_keys": ["a-key"], "max_prompt_tokens": 50},
    "b": {"api_keys": ["b-key"]},
}
MODEL = "llama3.1:8b"
MESSAGES = [{"role": "user", "content": "hi"}]
OUTPUT_PER_REPLY = 3  # FakeLLM's Script.chunks: its eval_count and usage.completion_tokens


def _requests(stream: bool) -> list[tuple[str, dict[str, Any]]]:
    return [("/api/chat", {"model": MODEL, "stream": stream, "messages": MESSAGES}),
            ("/v1/chat/completions", {"model": MODEL, "stream": stream, "messages": MESSAGES})]


async def _send(http: aiohttp.ClientSession, url: str, key: str, path: str, body: dict[str, Any]) -> tuple[int, int]:
    """The status and the prompt tokens kvgate said it forwarded (0 when it forwarded nothing)."""
    async with http.post(url + path, json=body, headers={"X-Api-Key": key}) as response:
        await response.read()
        return response.status, int(response.headers.get("X-Kvgate-Prompt-Tokens", "0"))


def _metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name.startswith("kvgate_tenant_") and sample.name.endswith("_total")}


def _table(rows: dict[str, Any]) -> str:
    lines = [f"{'tenant':<8} {'requests':<16} {'prompt':>6} {'output':>6} {'queue_s':>7}  refusals"]
    for name, row in rows.items():
        requests = ",".join(f"{k}={v}" for k, v in row["requests"].items()) or "-"
        refusals = ",".join(f"{k}={v}" for k, v in row["refusals"].items()) or "-"
        lines.append(f"{name:<8} {requests:<16} {row['prompt_tokens']:>6} {row['output_tokens']:>6} "
                     f"{row['queue_seconds']:>7}  {refusals}")
    return "\n".join(lines)


async def test_usage_per_tenant_agrees_with_what_was_sent_and_reported() -> None:
    sent: dict[str, Counter[str]] = {"a": Counter(), "b": Counter()}
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "b", "url": fake.url}], tenants=TENANTS,
        server={"require_api_key": True, "admin_key": "s3cret-admin"}, **exact_counting(MODEL),
    ) as url, aiohttp.ClientSession() as http:
        plan = [("a", "a-key", _requests(False) + _requests(True)), ("b", "b-key", _requests(True))]
        for tenant, key, requests in plan:
            for path, body in requests:
                status, prompt_tokens = await _send(http, url, key, path, body)
                assert status == 200, (tenant, path)
                assert prompt_tokens > 0
                sent[tenant].update(requests_2xx=1, prompt_tokens=prompt_tokens, output_tokens=OUTPUT_PER_REPLY)
        long_chat = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "word " * 400}]}
        status, _ = await _send(http, url, "a-key", "/api/chat", long_chat)  # over a's max_prompt_tokens
        assert status == 400
        status, _ = await _send(http, url, "nobody", "/api/chat", long_chat)  # no tenant: not counted as one
        assert status == 401

        async with http.get(url + "/kvgate/tenants", headers=ADMIN) as response:
            assert response.status == 200
            rows = (await response.json())["tenants"]
        async with http.get(url + "/kvgate/metrics", headers=ADMIN) as response:
            metrics = _metrics(await response.text())

    print("\n" + _table(rows))
    assert set(rows) == {"a", "b"}  # the refused bad key is no tenant
    for tenant in ("a", "b"):
        row = rows[tenant]
        assert row["requests"].get("2xx") == sent[tenant]["requests_2xx"]
        assert row["prompt_tokens"] == sent[tenant]["prompt_tokens"]
        assert row["output_tokens"] == sent[tenant]["output_tokens"]
        assert row["queue_seconds"] == 0 and row["active_sequences"] == 0
        labels = (("tenant", tenant),)
        assert metrics[("kvgate_tenant_prompt_tokens_total", labels)] == row["prompt_tokens"]
        assert metrics[("kvgate_tenant_output_tokens_total", labels)] == row["output_tokens"]
        assert metrics[("kvgate_tenant_queue_seconds_total", labels)] == row["queue_seconds"]
        assert sum(value for (name, key), value in metrics.items() if name == "kvgate_tenant_requests_total"
                   and ("tenant", tenant) in key) == row["requests_total"]
    assert rows["a"]["requests"] == {"2xx": 4, "4xx": 1} and rows["a"]["refusals"] == {"max_prompt_tokens": 1}
    assert rows["b"]["requests"] == {"2xx": 2} and rows["b"]["refusals"] == {}
    assert metrics[("kvgate_tenant_refusals_total", (("reason", "max_prompt_tokens"), ("tenant", "a")))] == 1
    assert not any(name == "kvgate_tenant_refusals_total" and ("tenant", "b") in key for name, key in metrics)
    assert not any(("tenant", "nobody") in key for _, key in metrics)


async def test_tenants_page_needs_the_admin_key_when_one_is_set() -> None:
    async with running_gateway([{"name": "b", "url": "http://127.0.0.1:9"}], tenants=TENANTS,
                               server={"admin_key": "s3cret-admin"}) as url, aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "a-key"},
                        {"Authorization": "Bearer a-key"}):
            async with http.get(url + "/kvgate/tenants", headers=headers) as response:
                assert response.status == 403
                assert (await response.json())["error"]["code"] == "admin_only"
        async with http.get(url + "/kvgate/tenants", headers=ADMIN) as response:
            assert response.status == 200
            rows = orjson.loads(await response.read())["tenants"]
    assert set(rows) == {"a", "b"} and rows["a"]["requests_total"] == 0  # configured tenants show before use


def test_refusal_reasons_are_bounded() -> None:
    key = PoolKey("b", "m")
    assert refusal_reason(AdmissionRejected(queue_full(key, 3, 3)), in_admission=True) == "queue_full"
    assert refusal_reason(AdmissionRejected(client_closed(key, 1.0)), in_admission=True) is None  # it left
    assert refusal_reason(LoadRefused("no room", 5.0), in_admission=False) == "gpu_memory"
    assert refusal_reason(BadRequest("cap"), in_admission=True) == "max_prompt_tokens"
    assert refusal_reason(BadRequest("bad json"), in_admission=False) is None
    assert refusal_reason(InvalidField("x", "bad"), in_admission=True) is None
    assert refusal_reason(Unauthorized("who"), in_admission=False) is None


def test_unidentified_requests_are_no_tenant() -> None:
    usage = TenantUsage()
    usage.add("-", 401)
    usage.add("a", 200, prompt_tokens=5, output_tokens=None, queue_s=0.25)
    usage.add("a", 503, refusal="queue_full")
    rows = usage.snapshot(("b",), {"a": 1})["tenants"]
    assert rows == {
        "a": {"requests": {"2xx": 1, "5xx": 1}, "requests_total": 2, "prompt_tokens": 5, "output_tokens": 0,
              "refusals": {"queue_full": 1}, "queue_seconds": 0.25, "active_sequences": 1},
        "b": {"requests": {}, "requests_total": 0, "prompt_tokens": 0, "output_tokens": 0, "refusals": {},
              "queue_seconds": 0.0, "active_sequences": 0},
    }
