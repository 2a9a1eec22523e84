"""The request side of the headers that cross the proxy: Host is the upstream's, the request id kvgate's, a
backend key is injected and a client's kvgate key never travels on; the request's own deadline. The rules both sides
share (hop-by-hop headers, the stream media types) are gateway/support/hop_headers.py."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.errors import BadRequest, GatewayError, MethodNotAllowed
from gateway.support.hop_headers import (
    HOP_BY_HOP,
    REQUEST_ID,
    connection_listed,
    downstream_response_headers,
    stream_kind,
)

__all__ = [
    "DEADLINE_HEADER", "KVGATE_ONLY", "MAX_DEADLINE_S", "MAX_REQUEST_ID_CHARS", "SDK_TIMEOUT_HEADER",
    "SDK_TIMEOUT_MARGIN", "SDK_TIMEOUT_MARGIN_MAX_S", "downstream_response_headers", "error_headers",
    "request_deadline", "request_id_for", "stream_kind", "upstream_request_headers",
]
"""``downstream_response_headers`` and ``stream_kind`` live in gateway/support/hop_headers.py (layers below the edge
read them); they are named here too because gateway/streaming.py imports them from this module."""

KVGATE_ONLY = frozenset({"x-kvgate-internal", "x-kvgate-route-backend"})
"""Headers meant for kvgate itself (its own summary requests): never sent on to a backend."""
MAX_REQUEST_ID_CHARS = 128


@dataclass(frozen=True, slots=True)
class Hop:
    """The next hop of one request: the upstream's Host, the request's id, and the backend's own key (if any)."""

    host: str
    request_id: str
    api_key: str | None = None


def upstream_request_headers(
    incoming: CIMultiDictProxy[str],
    hop: Hop,
    *,
    client_ip: str | None,
    strip_client_keys: bool = False,
    body_decoded: bool = False,
) -> CIMultiDict[str]:
    """End-to-end headers of the client's request, with Host set to the upstream (Ollama checks it). A client's
    key for kvgate itself (``strip_client_keys``) never travels on to the backend. A body kvgate read and decoded
    (``body_decoded``) goes on without its Content-Encoding; one streamed through keeps it, with its bytes."""
    host, request_id, api_key = hop.host, hop.request_id, hop.api_key
    drop = _DROPPED_UPSTREAM[body_decoded, strip_client_keys]
    if "Connection" in incoming:
        drop = drop | connection_listed(incoming)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        if name.lower() not in drop:
            out.add(name, value)
    out["Host"] = host
    out[REQUEST_ID] = request_id
    if api_key is not None:
        out["Authorization"] = f"Bearer {api_key}"
    if client_ip:
        prior = incoming.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{prior}, {client_ip}" if prior else client_ip
    return out


_DROPPED_UPSTREAM = {
    (decoded, stripped): frozenset(HOP_BY_HOP | {"host", "content-length", REQUEST_ID.lower()} | KVGATE_ONLY
                                   | ({"content-encoding"} if decoded else set())
                                   | ({"authorization", "x-api-key"} if stripped else set()))
    for decoded in (False, True) for stripped in (False, True)
}
"""The headers that never go upstream, by (body decoded, client keys stripped); a Connection header adds those it
names."""


DEADLINE_HEADER = "X-Kvgate-Deadline"
SDK_TIMEOUT_HEADER = "X-Stainless-Read-Timeout"
"""The OpenAI SDKs send their read timeout, in seconds, in this header (openai-python `_base_client`): how long they
wait for an answer."""
MAX_DEADLINE_S = 86_400.0
SDK_TIMEOUT_MARGIN = 0.2
SDK_TIMEOUT_MARGIN_MAX_S = 1.0
"""A request leaves the queue this much (a fifth, at most a second) before the SDK's own timeout, so that the client
reads kvgate's 503 (with Retry-After) instead of timing out itself."""


def request_deadline(headers: Mapping[str, str]) -> tuple[float, str] | None:
    """The request's own limit on its wait, in seconds, and which header set it: the smaller of ``X-Kvgate-Deadline``
    and the SDK's ``X-Stainless-Read-Timeout``; None when neither is sent. A value that is not a positive number of
    seconds is a 400 naming the header (the SDK's own header is ignored when odd: the client did not write it)."""
    found: list[tuple[float, str]] = []
    for name, strict in ((DEADLINE_HEADER, True), (SDK_TIMEOUT_HEADER, False)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw.strip())
        except ValueError:
            seconds = float("nan")
        if not 0 < seconds <= MAX_DEADLINE_S:
            if strict:
                raise BadRequest(f"{name} is {raw[:40]!r}; send the seconds the request may wait, a number from 0 to "
                                 f"{MAX_DEADLINE_S:g}, like '{name}: 30'")
            continue
        if not strict:  # the client gives up then: leave the queue early enough for the 503 to reach it
            seconds = max(seconds * (1 - SDK_TIMEOUT_MARGIN), seconds - SDK_TIMEOUT_MARGIN_MAX_S)
        found.append((seconds, f"{name}: {raw.strip()[:20]}"))
    return min(found) if found else None


def request_id_for(headers: Mapping[str, str]) -> str:
    """The client's X-Request-ID when it is sane, otherwise a new one."""
    given = headers.get(REQUEST_ID, "")
    if 0 < len(given) <= MAX_REQUEST_ID_CHARS and given.isprintable() and given.isascii():
        return given
    return secrets.token_hex(16)  # as random as uuid4's 122 bits, without building a UUID


def error_headers(error: GatewayError, request_id: str | None = None) -> dict[str, str]:
    headers = {} if request_id is None else {REQUEST_ID: request_id}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(error.retry_after_s)))
    if isinstance(error, MethodNotAllowed) and error.allowed:
        headers["Allow"] = ", ".join(error.allowed)
    return headers
