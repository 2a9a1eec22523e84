"""The header rules both sides of the proxy share (RFC 9110 section 7.6.1: hop-by-hop headers stop at each hop),
and the two stream media types.

The request side (Host, the client's keys, deadlines, request ids) is the HTTP edge's: gateway/edge/headers.py. What
is here is read by layers below the edge too: the backend's answer relayed whole (loads/oom_catch.py) or streamed
(streaming.py), the usage observer and the reply notice that tell NDJSON from SSE.
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy

KVGATE_PREFIX = "x-kvgate-"
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


def connection_listed(headers: Mapping[str, str]) -> frozenset[str]:
    """The headers a ``Connection`` header names: hop-by-hop too, for this message."""
    listed = headers.get("Connection", "")
    return frozenset(token.strip().lower() for token in listed.split(",") if token.strip())


def downstream_response_headers(upstream: CIMultiDictProxy[str], *, request_id: str) -> CIMultiDict[str]:
    """End-to-end headers of the backend's response, plus the request id. ``X-Kvgate-*`` headers are this kvgate's
    own account of the request: a backend's (another kvgate behind this one, or a server that forges them) never
    reach the client, where they would pass for this gateway's decisions."""
    listed = connection_listed(upstream) if "Connection" in upstream else frozenset()
    drop = _DROPPED_DOWNSTREAM | listed if listed else _DROPPED_DOWNSTREAM
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.items():
        lower = name.lower()
        if lower not in drop and not lower.startswith(KVGATE_PREFIX):
            out.add(name, value)
    out[REQUEST_ID] = request_id
    return out


_DROPPED_DOWNSTREAM = HOP_BY_HOP | {REQUEST_ID.lower()}
