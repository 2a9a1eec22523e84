"""The gateway's own errors: one tree, stable codes, one HTTP status each.

    GatewayError                 base; never raised itself
    ├── BadRequest               400  the client sent something the gateway can't accept
    │   ├── InvalidField         400  a JSON field is missing or has the wrong type
    │   └── InvalidConfig        400  a configuration (a reload) kvgate can't apply; names the setting
    ├── Unauthorized             401  a key no tenant has (once tenants have keys), or none when keys are required
    ├── ModelNotFound            404  no backend serves the model the request names
    ├── NotFound                 404  no such route
    ├── MethodNotAllowed         405  the route exists, not for this method
    ├── AdminOnly                403  an operator or model-management route without the admin key
    ├── RequestTimeout           408  the request body did not arrive within ``server.body_timeout_s``
    ├── PayloadTooLarge          413  the body is over ``server.max_body_bytes``
    ├── UnsupportedMediaType     415  the body has a Content-Encoding kvgate does not decode
    ├── ExpectationFailed        417  an ``Expect`` header other than ``100-continue``
    ├── ServerBusy               503  kvgate holds all the request-body bytes it may (with Retry-After)
    │   └── ConnectionsExhausted 503  at server.max_connections, or out of file descriptors: before any request
    ├── BackendNotReady          503  the backend's KV pool can't be learned right now (with Retry-After)
    ├── RateLimited              429  a tenant over its tokens or requests per minute (with Retry-After)
    ├── LoadRefused              503  a model load would overrun GPU memory and waiting won't help (Retry-After)
    ├── GpuLedgerUnavailable     503  a load decision needs the shared GPU ledger and Redis is away (Retry-After)
    ├── BackendUnavailable       502  the backend refused the connection or broke it before answering
    │   └── BackendDown          502  it refuses connections and has not answered lately: answered at once
    ├── BackendTimeout           504  the backend did not answer (or stalled) within a configured timeout
    └── InternalError            500  a bug in kvgate; logged with a traceback, rendered without one

ServerBusy, BackendNotReady, RateLimited and LoadRefused are RetryLater errors: each is raised with the
``retry_after_s`` it goes out with (ConnectionsExhausted: 1 s).

Third-party exceptions (aiohttp, orjson, asyncio) from calls to backends are translated into this tree at one
place, ``gateway.backends.client`` (its BackendCallError classes are BackendUnavailable or BackendTimeout), and
rendered in the dialect of the request by ``gateway.dialects``, at one boundary: ``gateway.edge.error_boundary`` (a
middleware for every handler, and ``error_response`` for the proxy and the edge's own refusals). ``param`` names what
the error is about (a field, a setting), where there is one.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """Base class: carries an HTTP status, a stable code and a message a user can act on."""

    status: int = 500
    code: str = "internal_error"
    retry_after_s: float | None = None
    """Sent as ``Retry-After`` when set: when it makes sense to try again."""
    param: str | None = None
    """The field or setting the error is about, where there is one (OpenAI's ``param``)."""

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None, **kwargs: Any) -> None:
        """A subclass names its HTTP status and stable code in its header: ``class NotFound(GatewayError,
        status=404, code="not_found")``; one it leaves out is its base's."""
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RetryLater(GatewayError):
    """Base of the errors a client may retry: raised with the seconds after which trying again makes sense, sent
    as ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BadRequest(GatewayError, status=400, code="invalid_request"):
    """Raised when the request body or query can't be accepted as it is."""


class InvalidField(BadRequest, code="invalid_field"):
    """Raised when a JSON field is missing or has the wrong type; names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.param = field


class InvalidConfig(BadRequest, code="invalid_config"):
    """Raised when a configuration can't be applied (a reload); ``param`` names the first setting at fault (a dotted
    name like ``tenants.ci.max_active``, ``--config`` for the file itself, None when settings disagree)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class NotFound(GatewayError, status=404, code="not_found"):
    """Raised for a path no route serves."""


class MethodNotAllowed(GatewayError, status=405, code="method_not_allowed"):
    """Raised for a route asked with a method it does not take; ``allowed`` goes out as the ``Allow`` header."""

    def __init__(self, message: str, allowed: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.allowed = allowed


class Unauthorized(GatewayError, status=401, code="invalid_api_key"):
    """Raised when a request needs a tenant's API key and carries none, or an unknown one."""


class PayloadTooLarge(GatewayError, status=413, code="payload_too_large"):
    """Raised when a body is larger than the configured limit."""


class UnsupportedMediaType(GatewayError, status=415, code="unsupported_media_type"):
    """Raised when a request body has a Content-Encoding kvgate does not decode (it decodes gzip and deflate)."""


class ServerBusy(RetryLater, status=503, code="server_busy"):
    """Raised when kvgate already holds all the request-body bytes it may (``server.max_held_body_bytes``)."""


class ConnectionsExhausted(ServerBusy, code="connections_exhausted"):
    """A connection kvgate can't serve: at ``server.max_connections`` with none to close, or within the descriptor
    reserve of RLIMIT_NOFILE. Answered before any request is read (``gateway.edge.serving``), so in no route's dialect:
    Ollama's ``{"error": "..."}``, which the OpenAI clients read as the message too."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=1.0)


class ReplyEnded(RetryLater, status=503, code="reply_ended_by_kvgate"):
    """A reply that was not streamed, ended by kvgate before it came (``admission.elastic``: its pool had no room
    for it to grow, and nothing kvgate could end cleanly was left); nothing reached the client yet."""


class ModelNotFound(GatewayError, status=404, code="model_not_found"):
    """Raised when a request names a model that no backend lists (after refreshing the lists)."""


class BackendNotReady(RetryLater, status=503, code="backend_not_ready"):
    """Raised when a request would allocate KV on a backend whose pool can't be probed now; never forwarded
    unaccounted."""


class RateLimited(RetryLater, status=429, code="rate_limited"):
    """Raised when a tenant is over its tokens or requests per minute; Retry-After says when the bucket holds enough."""


class LoadRefused(RetryLater, status=503, code="gpu_memory_exhausted"):
    """Raised when a model can't be loaded without overrunning GPU memory and waiting won't make room; the message
    names the model, the bytes it needs and the bytes free."""


class GpuLedgerUnavailable(RetryLater, status=503, code="ledger_unavailable"):
    """Raised when a load decision needs the shared GPU ledger's lease (``[shared_ledger]``, on_unreachable =
    "refuse") and Redis does not answer: no replica decides a load it can't serialise with the others'."""


class BackendUnavailable(GatewayError, status=502, code="backend_unavailable"):
    """Raised when a backend can't be reached or drops the connection before responding."""


class BackendDown(BackendUnavailable):
    """Raised when a backend refuses connections and has not answered within ``admission.probe_wait_s``: it is down,
    so the request is answered at once instead of waiting for it (gateway/backends/liveness.py)."""


class BackendTimeout(GatewayError, status=504, code="backend_timeout"):
    """Raised when a backend does not connect, answer or continue a stream within its timeout."""


class InternalError(GatewayError, status=500, code="internal_error"):
    """Raised for unexpected failures inside kvgate; the client sees a message, never a traceback."""


class AdminOnly(GatewayError, status=403, code="admin_only"):
    """A model-management route (``server.admin_only_management``) asked for without the admin key."""


class RequestTimeout(GatewayError, TimeoutError, status=408, code="request_timeout"):
    """Raised from a request body's read when the body did not arrive within ``server.body_timeout_s``.

    A ``TimeoutError`` too, so that aiohttp, draining what is left of the body after the answer, takes it as a
    timeout and closes the connection quietly."""


class ExpectationFailed(GatewayError, status=417, code="expectation_failed"):
    """Raised for an ``Expect`` header other than ``100-continue`` (odd bytes included)."""
