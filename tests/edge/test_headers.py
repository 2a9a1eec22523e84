"""Which headers cross the proxy: hop-by-hop ones stop (RFC 9110 section 7.6.1), Host is the upstream's, the request
id is kvgate's, a backend key is injected and a client's kvgate key never travels on; streams are told by type."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.edge.headers import Hop, upstream_request_headers
from gateway.support.hop_headers import HOP_BY_HOP, NDJSON, REQUEST_ID, SSE, downstream_response_headers, stream_kind


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


def upstream(incoming: CIMultiDictProxy[str], *, host: str = "127.0.0.1:11434", request_id: str = "rid-1",
             api_key: str | None = None, **options: Any) -> CIMultiDict[str]:
    return upstream_request_headers(incoming, Hop(host, request_id, api_key), **{"client_ip": None, **options})


@pytest.mark.parametrize(
    ("header", "kind"),
    [("application/x-ndjson", NDJSON), ("text/event-stream; charset=utf-8", SSE), ("application/json", None),
     ("", None), ("Application/X-NDJSON", NDJSON), ("  text/event-stream  ;x=1", SSE), ("text/event-streamx", None)],
)
def test_stream_kind(header: str, kind: str | None) -> None:
    assert stream_kind(header) == kind


@pytest.mark.parametrize("name", sorted(HOP_BY_HOP))
def test_each_hop_by_hop_header_stops_both_ways(name: str) -> None:
    sent = headers((name.title(), "x"), ("X-Kept", "1"))
    for out in (upstream(sent), downstream_response_headers(sent, request_id="r")):
        assert name not in out and out["X-Kept"] == "1"


def test_hop_by_hop_set_is_the_rfc_list() -> None:
    rfc = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
           "trailer", "transfer-encoding", "upgrade"}
    assert rfc == HOP_BY_HOP


def test_headers_the_connection_header_lists_stop_too() -> None:
    sent = headers(("Connection", "keep-alive, X-Secret ,, x-other"), ("X-Secret", "1"), ("X-Other", "2"),
                   ("X-Client", "kept"))
    for out in (upstream(sent), downstream_response_headers(sent, request_id="r")):
        assert "X-Secret" not in out and "X-Other" not in out and "Connection" not in out
        assert out["X-Client"] == "kept"


def test_host_is_the_upstream_and_length_is_recomputed() -> None:
    out = upstream(headers(("Host", "evil.example.com"), ("Content-Length", "5"), ("Content-Type", "text/plain")),
                   host="10.0.0.2:8080")
    assert out.getall("Host") == ["10.0.0.2:8080"]
    assert "Content-Length" not in out and out["Content-Type"] == "text/plain"


def test_the_request_id_is_kvgates_both_ways() -> None:
    sent = headers((REQUEST_ID, "client-chosen"), ("x-request-id", "second"))
    assert upstream(sent, request_id="abc-123").getall(REQUEST_ID) == ["abc-123"]
    assert downstream_response_headers(sent, request_id="abc-123").getall(REQUEST_ID) == ["abc-123"]


def test_a_backend_key_replaces_the_clients_authorization() -> None:
    sent = headers(("Authorization", "Bearer client"), ("X-Api-Key", "client-key"))
    out = upstream(sent, api_key="backend-secret")
    assert out.getall("Authorization") == ["Bearer backend-secret"]
    assert out["X-Api-Key"] == "client-key"  # not kvgate's: it goes on
    assert upstream(sent)["Authorization"] == "Bearer client"  # no backend key: the client's goes on


def test_client_keys_for_kvgate_never_reach_the_backend() -> None:
    sent = headers(("Authorization", "Bearer tenant-key"), ("X-Api-Key", "tenant-key"), ("X-Kept", "1"))
    out = upstream(sent, strip_client_keys=True)
    assert "Authorization" not in out and "X-Api-Key" not in out and out["X-Kept"] == "1"
    with_backend_key = upstream(sent, strip_client_keys=True, api_key="backend-secret")
    assert with_backend_key.getall("Authorization") == ["Bearer backend-secret"]
    assert "tenant-key" not in str(with_backend_key)


def test_content_encoding_goes_only_with_the_bytes_it_describes() -> None:
    sent = headers(("Content-Encoding", "gzip"))
    assert upstream(sent)["Content-Encoding"] == "gzip"  # streamed through as sent
    assert "Content-Encoding" not in upstream(sent, body_decoded=True)


def test_forwarded_for_appends_the_client() -> None:
    assert upstream(headers(), client_ip="10.1.1.1")["X-Forwarded-For"] == "10.1.1.1"
    chained = upstream(headers(("X-Forwarded-For", "203.0.113.9")), client_ip="10.1.1.1")
    assert chained["X-Forwarded-For"] == "203.0.113.9, 10.1.1.1"
    assert "X-Forwarded-For" not in upstream(headers(), client_ip=None)


def test_repeated_end_to_end_headers_keep_every_value() -> None:
    sent = headers(("Accept", "a"), ("Accept", "b"), ("Set-Cookie", "x=1"), ("Set-Cookie", "y=2"))
    assert upstream(sent).getall("Accept") == ["a", "b"]
    assert downstream_response_headers(sent, request_id="r").getall("Set-Cookie") == ["x=1", "y=2"]


def test_a_backends_kvgate_headers_never_pass_for_this_gateways() -> None:
    sent = headers(("X-Kvgate-Queue-Wait-S", "0"), ("x-kvgate-route", "forged"), ("X-Kvgate", "kept: not ours"),
                   ("X-Kvgateway-Thing", "kept"), ("Content-Type", "application/json"))
    out = downstream_response_headers(sent, request_id="r")
    assert sorted(out) == ["Content-Type", "X-Kvgate", "X-Kvgateway-Thing", REQUEST_ID]
