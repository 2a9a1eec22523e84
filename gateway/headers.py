"""Which headers cross the proxy (RFC 9110 section 7.6.1: hop-by-hop headers stop at each hop)."""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy

KVGATE_ONLY = frozenset({"x-kvgate-internal", "x-kvgate-route-backend"})
"""Headers meant for kvgate itself (its own summary requests): never sent on to a backend."""
HOP_BY_HOP = frozenset(
    name.lower()
    for name in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
        "TE", "Trailer", "Transfer-Encoding", "Upgrade",
    )
)
REQUEST_ID = "X-Request-ID"
NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


def stream_kind(content_type: str) -> str | None:
    """``NDJSON``, ``SSE`` or None for a Content-Type header value."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media if media in (NDJSON, SSE) else None


def _connection_listed(headers: Mapping[str, str]) -> frozenset[str]:
    listed = headers.get("Connection", "")
    return frozenset(token.strip().lower() for token in listed.split(",") if token.strip())


def upstream_request_headers(
    incoming: CIMultiDictProxy[str],
    *,
    host: str,
    request_id: str,
    api_key: str | None,
    client_ip: str | None,
    strip_client_keys: bool = False,
    body_decoded: bool = False,
) -> CIMultiDict[str]:
    """End-to-end headers of the client's request, with Host set to the upstream (Ollama checks it). A client's
    key for kvgate itself (``strip_client_keys``) never travels on to the backend. A body kvgate read and decoded
    (``body_decoded``) goes on without its Content-Encoding; one streamed through keeps it, with its bytes."""
    drop = HOP_BY_HOP | _connection_listed(incoming) | {"host", "content-length", REQUEST_ID.lower()} | KVGATE_ONLY
    if body_decoded:
        drop |= {"content-encoding"}
    if strip_client_keys:
        drop |= {"authorization", "x-api-key"}
    out: CIMultiDict[str] = CIMultiDict((k, v) for k, v in incoming.items() if k.lower() not in drop)
    out["Host"] = host
    out[REQUEST_ID] = request_id
    if api_key is not None:
        out["Authorization"] = f"Bearer {api_key}"
    if client_ip:
        prior = incoming.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{prior}, {client_ip}" if prior else client_ip
    return out


def downstream_response_headers(upstream: CIMultiDictProxy[str], *, request_id: str) -> CIMultiDict[str]:
    """End-to-end headers of the backend's response, plus the request id."""
    drop = HOP_BY_HOP | _connection_listed(upstream) | {REQUEST_ID.lower()}
    out: CIMultiDict[str] = CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in drop)
    out[REQUEST_ID] = request_id
    return out
