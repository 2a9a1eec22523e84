"""Hostile bytes, one at a time (issue 10, point 3): each was a 500 once; test_fuzz.py covers them all at scale."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import dialects
from gateway.admission import Ledger, PoolKey, WaitingRoom
from gateway.admission.outcome import AdmissionOutcome, Reserved
from gateway.admission.tenant_keys import ANONYMOUS, TenantDirectory
from gateway.api.status import status_html
from gateway.backends.client import URL_CACHE, BackendClient
from gateway.backends.registry import Backend
from gateway.config.settings import BackendSettings, load_settings
from gateway.domain import Dialect, Operation
from gateway.edge.targets import target_problem
from gateway.errors import BadRequest, InvalidField, Unauthorized
from gateway.fitting.rewrite import encode_body
from gateway.observability.metrics import Metrics, record
from gateway.observability.truncations import TruncationLog
from gateway.runtimes import runtime_for
from gateway.support.safe_text import safe_text
from gateway.tokens import TokenCount
from tests.support.exchanges import ended
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

ODD = ["llama3.1:8b\udcff", "hi \ud83d", "\udcff\udcfe", "a\x00b", "\ud83d\ude00"]


@pytest.mark.parametrize("text", ODD)
def test_safe_text_always_encodes(text: str) -> None:
    safe_text(text).encode("utf-8")
    assert safe_text("plain é 日本") == "plain é 日本"


@given(st.text())
def test_safe_text_is_identity_on_encodable_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        safe_text(text).encode("utf-8")
    else:
        assert safe_text(text) == text


def _directory(required: bool) -> TenantDirectory:
    return TenantDirectory(load_settings(None, tenants={"t": {"api_keys": ["good-key"]}},
                                         server={"require_api_key": required}))


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer good-key\udcff"}, {"X-Api-Key": "\udcffgood-key"},
                                     {"Authorization": "Bearer \udcc3\udca9"}, {"X-Api-Key": "clé"},
                                     {"Authorization": "Bearer \ud83d"}])
def test_a_key_with_odd_bytes_is_an_unknown_key(headers: dict[str, str]) -> None:
    for required in (False, True):  # once tenants have keys, an unknown key is refused, keys required or not
        with pytest.raises(Unauthorized):
            _directory(required).identify(headers)
    assert TenantDirectory(load_settings(None)).identify(headers).name == ANONYMOUS  # no tenants at all
    assert _directory(True).identify({"X-Api-Key": "good-key"}).name == "t"


@pytest.mark.parametrize("url", ["http://backend", "http://127.0.0.1:8080", "https://h:1"])
@pytest.mark.parametrize("target", ["http://169.254.169.254/latest/meta-data/", "//evil.com/x", "@evil.com/x",
                                    "https:evil", "/api/chat?x=http://evil/", "/a#@evil"])
async def test_url_for_never_changes_the_host(url: str, target: str) -> None:
    settings = BackendSettings(name="b", url=url)
    async with aiohttp.ClientSession() as session:
        backend = Backend(settings, BackendClient.for_backend(session, settings), runtime=runtime_for(settings.kind))
    built = backend.url_for(target)
    assert (built.scheme, built.host, built.explicit_port) == (backend.base_url.scheme, backend.base_url.host,
                                                               backend.base_url.explicit_port)
    assert str(built).startswith(str(backend.base_url).rstrip("/") + "/")


async def test_url_for_answers_the_same_from_its_cache_and_keeps_it_bounded() -> None:
    settings = BackendSettings(name="b", url="http://127.0.0.1:8080")
    async with aiohttp.ClientSession() as session:
        client = BackendClient.for_backend(session, settings)
    targets = ["/api/chat", "//evil.com/x", "/a#@evil", "/v1/models?x=%ff", *(f"/p{i}" for i in range(URL_CACHE * 2))]
    first = [client.url_for(t) for t in targets]
    again = [client.url_for(t) for t in targets]
    assert first == again == [client._build_url(t) for t in targets]
    assert str(first[1]) == "http://127.0.0.1:8080/evil.com/x"
    assert len(client._urls) <= URL_CACHE  # targets come from clients: a flood of distinct ones is not kept


@pytest.mark.parametrize("target", ["http://169.254.169.254/", "*", "example.com:443", "/a#b", "/a\\b",
                                    "/a\udcff", "relative", ""])
def test_odd_targets_have_a_problem(target: str) -> None:
    assert target_problem(target) is not None


@pytest.mark.parametrize("target", ["/", "/api/chat", "/v1/models/llama3.1:8b?x=1&y=%ff", "//double"])
def test_origin_form_targets_pass(target: str) -> None:
    assert target_problem(target) is None


def test_a_rewritten_body_keeps_odd_strings_as_they_came() -> None:
    raw = b'{"a":"hi \\ud83d","b":"x\xffy","n":1}'
    body = json.loads(raw.decode("utf-8", "surrogateescape"))
    body["n"] = 2
    assert encode_body(body) == b'{"a":"hi \\ud83d","b":"x\xffy","n":2}'


def test_a_body_too_deep_to_rewrite_is_a_400() -> None:
    deep: list[object] = []
    for _ in range(3000):
        deep = [deep]
    assert len(encode_body({"deep": _nested(500)})) > 1000  # deeper than orjson writes, within Python's reach
    with pytest.raises(BadRequest):
        encode_body({"deep": deep})


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize("message", ODD)
def test_errors_with_odd_text_render_in_every_dialect(dialect: Dialect, message: str) -> None:
    for error in (BadRequest(f"model '{message}' is odd"), InvalidField("model", message)):
        orjson.loads(dialects.error_body(dialect, error))
        assert dialects.stream_error_event(dialect, error)


@pytest.mark.parametrize("model", ODD)
def test_a_parsed_model_name_is_safe_text(model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi \ud83d"}]}
    parsed = dialects.parse(Dialect.OPENAI, Operation.CHAT, body, "/v1/chat/completions")
    assert parsed.model == safe_text(model)
    assert parsed.body["model"] == model  # forwarded as sent


def test_metrics_and_the_status_page_encode_odd_labels() -> None:
    metrics = Metrics()
    room = WaitingRoom(Ledger())
    reservation = room.ledger.reserve(PoolKey("b\udcff", "llama3.1:8b\udcff"), 10, "t")
    metrics.watch_pools(room, lambda: {})
    record(metrics, ended("/api/chat", 200, backend="b\udcff", tenant="t\ud83d"), 0.1)
    metrics.child(metrics.truncations, "b", "m\udcff").inc()
    text = metrics.exposition().decode()
    assert 'model="llama3.1:8b\ufffd"' in text
    room.ledger.release(reservation)
    log = TruncationLog()
    log.add(request_id="r\udcff", backend="b", model="m\udcff", counted_tokens=9, reported_tokens=5, counter="c")
    page = status_html({"version": "1", "uptime_s": 1.0, "backends": [
        {"name": "b", "kind": "ollama", "url": "u", "models": ["x\udcff"], "last_error": "e\ud83d", "notes": []}],
        "pools": [], "truncations": log.snapshot()})
    page.encode("utf-8")


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[int, FakeLLM]]:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "b", "url": fake.url}], tenants={"t": {"api_keys": ["good-key"], "max_output_tokens": 64}},
        server={"admin_key": "admin-key-1"},
    ) as url:
        yield int(url.rsplit(":", 1)[1]), fake


async def _raw(port: int, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await reader.read(-1)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@pytest.mark.parametrize(("target", "shape"), [
    (b"http://169.254.169.254/api/tags", lambda b: isinstance(b["error"], str)),
    (b"http://169.254.169.254/v1/models", lambda b: set(b["error"]) == {"message", "type", "param", "code"}),
    (b"http://b/completion", lambda b: b["error"]["code"] == 400),
    (b"/a#frag", lambda b: b["error"]["code"] == 400),
])
async def test_absolute_form_targets_get_a_400_and_never_reach_the_backend(
    gateway: tuple[int, FakeLLM], target: bytes, shape: object
) -> None:
    port, fake = gateway
    status, body = await _raw(port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 400
    assert shape(orjson.loads(body))  # type: ignore[operator]
    assert [seen for seen in fake.seen if "169.254" in seen.path_qs or "frag" in seen.path_qs] == []


async def test_odd_header_bytes_are_an_unknown_key(gateway: tuple[int, FakeLLM]) -> None:
    port, _ = gateway
    headers = (b"Authorization: Bearer good-key\xff", b"X-Api-Key: \xc3\x28", b"Authorization: Bearer \xed\xa0\xbd")
    for header in headers:
        for path in (b"/api/version", b"/kvgate/metrics", b"/kvgate/status"):
            status, _ = await _raw(port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + header +
                                   b"\r\nX-Request-ID: \xff\r\nConnection: close\r\n\r\n")
            expected = (401,) if path == b"/api/version" else (200, 403)  # an unknown key on a client route
            assert status in expected, (path, header, status)


async def test_a_lone_surrogate_survives_a_rewrite(gateway: tuple[int, FakeLLM]) -> None:
    port, fake = gateway
    body = (b'{"model":"llama3.1:8b","stream":false,"messages":[{"role":"user","content":"hi \\ud83d \xff"}],'
            b'"options":{"num_predict":4096}}')
    status, reply = await _raw(port, b"POST /api/chat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good-key\r\n"
                               b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    assert status == 200, reply
    sent = fake.seen[-1].body
    assert b'"hi \\ud83d \xff"' in sent and b'"num_predict":64' in sent


def test_a_backends_own_kvgate_headers_never_break_the_count() -> None:
    metrics = Metrics()
    record(metrics, ended("other", 200, backend="b\udcff", tenant=None), 0.1)
    odd = AdmissionOutcome(TokenCount(3, "x\udcff", False), reserved=Reserved(PoolKey("b\udcff", "m"), 1, 1))
    record(metrics, ended("other", 200, backend="b\udcff", tenant=None, outcome=odd), 0.1)
    assert b"kvgate_requests_total" in metrics.exposition()
