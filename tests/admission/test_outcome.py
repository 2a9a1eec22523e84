"""The admission outcome is data; headers, log fields and metrics are each rendered from it, never read back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from gateway.admission import PoolKey
from gateway.admission.outcome import (
    AdmissionDecision,
    AdmissionOutcome,
    Reserved,
    Trim,
    decision_labels,
    log_fields,
    response_headers,
)
from gateway.app import METRICS, create_app, start_server
from gateway.config.settings import load_settings
from gateway.observability.metrics import Metrics, record
from gateway.tokens import TokenCount
from tests.support.exchanges import ended
from tests.support.fake_backend import FakeLLM, running

EXACT = TokenCount(120, "gguf", True)
ESTIMATE = TokenCount(300, "estimate", False)
POOL = PoolKey("b", "llama3.1:8b")

PLAIN = AdmissionOutcome(EXACT, reserved=Reserved(POOL, 1144, 1))
WAITED = AdmissionOutcome(EXACT, waited_s=1.23456, reserved=Reserved(POOL, 1144, 1),
                          notes=("waited 1.23 s in the queue",))
REWRITTEN = AdmissionOutcome(EXACT, reserved=Reserved(POOL, 1144, 1),
                             rewrites=("options.num_ctx=8192 (was 16384)", "options.num_predict=1024 (was unset)"))
TRIMMED = AdmissionOutcome(ESTIMATE, recount=TokenCount(9000, "gguf", True), trim=Trim(4, 7, 9000, 2100),
                           reserved=Reserved(POOL, 3124, 1))
RECOUNTED = AdmissionOutcome(ESTIMATE, recount=TokenCount(250, "gguf", True), reserved=Reserved(POOL, 1274, 1))
TENANT_CAP = AdmissionOutcome(ESTIMATE, rewrites=("max_tokens=64 (was 4000)",))
UNPOOLED = AdmissionOutcome(ESTIMATE)


@pytest.mark.parametrize(
    ("outcome", "headers"),
    [
        (PLAIN, {"X-Kvgate-Prompt-Tokens": "120", "X-Kvgate-Counter": "gguf; exact",
                 "X-Kvgate-Reserved-Tokens": "1144", "X-Kvgate-Queue-Wait": "0.000"}),
        (WAITED, {"X-Kvgate-Prompt-Tokens": "120", "X-Kvgate-Counter": "gguf; exact",
                  "X-Kvgate-Reserved-Tokens": "1144", "X-Kvgate-Queue-Wait": "1.235"}),
        (REWRITTEN, {"X-Kvgate-Prompt-Tokens": "120", "X-Kvgate-Counter": "gguf; exact",
                     "X-Kvgate-Reserved-Tokens": "1144", "X-Kvgate-Queue-Wait": "0.000",
                     "X-Kvgate-Rewrite": "options.num_ctx=8192 (was 16384); options.num_predict=1024 (was unset)"}),
        (TRIMMED, {"X-Kvgate-Prompt-Tokens": "2100", "X-Kvgate-Counter": "gguf; exact",
                   "X-Kvgate-Trimmed": "dropped the 4 oldest of 7 messages; prompt 9,000 -> 2,100 tokens",
                   "X-Kvgate-Reserved-Tokens": "3124", "X-Kvgate-Queue-Wait": "0.000"}),
        (RECOUNTED, {"X-Kvgate-Prompt-Tokens": "250", "X-Kvgate-Counter": "gguf; exact",
                     "X-Kvgate-Reserved-Tokens": "1274", "X-Kvgate-Queue-Wait": "0.000"}),
        (TENANT_CAP, {"X-Kvgate-Prompt-Tokens": "300", "X-Kvgate-Counter": "estimate; estimate",
                      "X-Kvgate-Rewrite": "max_tokens=64 (was 4000)"}),
        (UNPOOLED, {"X-Kvgate-Prompt-Tokens": "300", "X-Kvgate-Counter": "estimate; estimate"}),
    ],
    ids=["plain", "after-wait", "rewrite", "trim", "recount", "tenant-cap-no-pool", "no-pool"],
)
def test_response_headers_are_rendered_in_order(outcome: AdmissionOutcome, headers: dict[str, str]) -> None:
    rendered = response_headers(outcome)
    assert rendered == headers
    assert list(rendered) == list(headers)  # the order they have always been sent in


@pytest.mark.parametrize(
    ("outcome", "decision", "labels"),
    [
        (PLAIN, AdmissionDecision.ADMITTED, ("admitted",)),
        (WAITED, AdmissionDecision.ADMITTED_AFTER_WAIT, ("admitted", "queued")),
        (REWRITTEN, AdmissionDecision.ADMITTED, ("admitted", "rewritten", "clamped", "pinned")),
        (TRIMMED, AdmissionDecision.ADMITTED, ("admitted", "trimmed")),
        (TENANT_CAP, AdmissionDecision.FORWARDED_WITHOUT_POOL, ("forwarded_without_pool", "rewritten", "clamped")),
        (UNPOOLED, AdmissionDecision.FORWARDED_WITHOUT_POOL, ("forwarded_without_pool",)),
    ],
)
def test_decisions_and_their_metric_labels(
    outcome: AdmissionOutcome, decision: AdmissionDecision, labels: tuple[str, ...]
) -> None:
    assert outcome.decision is decision
    assert decision_labels(outcome) == labels


def test_log_fields_name_the_count_the_reservation_the_wait_and_the_decision() -> None:
    assert log_fields(WAITED) == {"decision": "admitted_after_wait", "prompt_tokens": 120, "counter": "gguf",
                                  "exact": True, "reserved_tokens": 1144, "queue_wait_s": 1.235}
    assert log_fields(TRIMMED)["prompt_tokens"] == 2100 and log_fields(TRIMMED)["trimmed_messages"] == 4
    assert log_fields(UNPOOLED) == {"decision": "forwarded_without_pool", "prompt_tokens": 300,
                                    "counter": "estimate", "exact": False}


def test_metrics_are_recorded_from_the_outcome() -> None:
    metrics = Metrics()
    for outcome in (WAITED, TRIMMED, TENANT_CAP):
        record(metrics, ended("/api/chat", 200, backend="b", outcome=outcome), 0.1)
    record(metrics, ended("/api/tags", 200), 0.1)
    record(metrics, ended("/api/chat", 503, backend="b", refusal="queue_full", pool=POOL), 0.1)
    record(metrics, ended("/api/chat", 499, backend="b"), 0.1)  # the client left: no refusal
    value = metrics.registry.get_sample_value
    assert value("kvgate_decisions_total", {"backend": "b", "decision": "admitted"}) == 2
    assert value("kvgate_decisions_total", {"backend": "b", "decision": "queued"}) == 1
    assert value("kvgate_decisions_total", {"backend": "b", "decision": "trimmed"}) == 1
    assert value("kvgate_decisions_total", {"backend": "b", "decision": "rewritten"}) == 1
    assert value("kvgate_decisions_total", {"backend": "b", "decision": "clamped"}) == 1
    assert value("kvgate_decisions_total", {"backend": "b", "decision": "forwarded_without_pool"}) == 1
    assert value("kvgate_decisions_total", {"backend": "b", "decision": "refused"}) == 1
    assert value("kvgate_prompt_tokens_total", {"backend": "b", "counter": "gguf", "exact": "exact"}) == 120 + 2100
    assert value("kvgate_prompt_tokens_total", {"backend": "b", "counter": "estimate", "exact": "estimate"}) == 300
    assert value("kvgate_requests_total", {"route": "/api/chat", "backend": "b", "status": "200"}) == 3
    assert metrics.outcomes.pool(POOL).to_json()["refused"] == {"queue_full": 1}
    assert metrics.outcomes.total.to_json()["admitted_total"] == 2
    assert value("kvgate_requests_total", {"route": "/api/tags", "backend": "-", "status": "200"}) == 1


def test_counts_added_between_reads_reach_every_reader_once() -> None:
    """Requests add to a plain dict (Metrics.count); a scrape and get_sample_value both see every count, once."""
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    labels = {"route": "/api/chat", "backend": "b", "status": "200"}
    seen = []
    for batch in (3, 0, 2):
        for _ in range(batch):
            record(metrics, ended("/api/chat", 200, backend="b", outcome=WAITED), 0.1)
        seen.append(value("kvgate_requests_total", labels))
    scraped = metrics.exposition().decode()
    record(metrics, ended("/api/chat", 200, backend="b", outcome=WAITED), 0.1)
    print(f"after 3, 0, 2 requests: {seen}; the scrape then: {scraped.count('kvgate_requests_total{')} series")
    assert seen == [3, 3, 5]
    assert 'kvgate_requests_total{backend="b",route="/api/chat",status="200"} 5.0' in scraped
    assert value("kvgate_requests_total", labels) == 6
    with pytest.raises(ValueError, match="can't go down"):
        metrics.count(metrics.tenant_output_tokens, "t", amount=-1)


@asynccontextmanager
async def _gateway(backend: dict[str, object]) -> AsyncIterator[tuple[str, Metrics]]:
    app = create_app(load_settings(None, backends=[backend]), refresh_models=False)
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", app[METRICS]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("kind", "admitted"), [("ollama", 1.0), ("openai", None)])
async def test_a_backends_own_kvgate_headers_do_not_change_the_decision_counters(
    kind: str, admitted: float | None
) -> None:
    """The backend sends X-Kvgate-Reserved-Tokens: junk; with a pool (ollama) kvgate's own value replaces it, without
    one (an openai server with no layout) the client sees none: a backend's X-Kvgate-* headers never reach the client,
    and no decision is counted from them."""
    fake = FakeLLM()
    fake.script.extra_headers = {"X-Kvgate-Reserved-Tokens": "junk", "X-Kvgate-Queue-Wait": "9.5",
                                 "X-Kvgate-Trimmed": "junk"}
    path = "/api/chat" if kind == "ollama" else "/v1/chat/completions"
    body = {"model": "llama3.1:8b", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with running(fake), _gateway({"name": "b", "kind": kind, "url": fake.url}) as (url, metrics), \
            aiohttp.ClientSession() as http, http.post(url + path, json=body) as response:
        assert response.status == 200, await response.text()  # the fake sends its extra headers on streams
        await response.read()
        sent = response.headers.get("X-Kvgate-Reserved-Tokens")
        assert response.headers.get("X-Kvgate-Queue-Wait") != "9.5" and "X-Kvgate-Trimmed" not in response.headers
    assert sent != "junk" and (sent is not None) == (admitted is not None)
    value = metrics.registry.get_sample_value
    assert value("kvgate_decisions_total", {"backend": "b", "decision": "admitted"}) == admitted
    for decision in ("queued", "trimmed"):
        assert value("kvgate_decisions_total", {"backend": "b", "decision": decision}) is None
    assert value("kvgate_requests_total", {"route": path, "backend": "b", "status": "200"}) == 1
