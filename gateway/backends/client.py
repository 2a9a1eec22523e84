"""One client per backend: base URL, auth, Host, timeouts, JSON calls, the proxy's streaming open.

Every HTTP call kvgate makes to a backend goes through a ``BackendClient`` (the session is injected and shared), and
every transport failure (aiohttp, asyncio, orjson) is translated into the gateway's errors at one place,
``call_error``, by one table:

    BackendCallError              base: a call to a backend failed; the message names the backend and the call
    ├── BackendUnreachable   502  connection refused, no such host (aiohttp.ClientConnectorError)
    ├── BackendDropped       502  the connection broke before an answer (ServerDisconnectedError, other ClientError)
    ├── BackendStatusError   502  an answer with a status other than 2xx (``backend_status``; ClientResponseError)
    ├── BackendBadReply      502  an answer that is not JSON, or JSON that is not an object (ValueError, orjson)
    └── BackendCallTimeout   504  no connection within connect_s, or no answer within first_byte_s (or a call's cap)

Each is also a ``BackendUnavailable`` or ``BackendTimeout`` of ``gateway.errors``, so the proxy lets them through to
be rendered; probers, counters and VRAM readers wrap them in their own types in one line.

The client also keeps the backend's ``Liveness`` (liveness.py): every answer, of any status, marks it up, and a
refused connection on a backend that was up within ``restart_wait_s`` is waited through (a restart) for JSON calls
and, where the caller allows it, for forwarded requests; on one that was not, it is refused at once.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson
from multidict import CIMultiDict, istr
from yarl import URL

from gateway.backends.liveness import RETRY_FIRST_S, RETRY_MAX_S, Liveness
from gateway.config.settings import BackendSettings, TimeoutSettings
from gateway.errors import BackendTimeout, BackendUnavailable, GatewayError

log = logging.getLogger(__name__)

Body = bytes | AsyncIterator[bytes] | None
T = TypeVar("T")
ERROR_TEXT_CHARS = 200
"""How much of an error answer's body a BackendStatusError quotes."""


class BackendCallError(GatewayError):
    """Raised when a call to a backend fails; never raised itself (one of the subclasses below is)."""

    backend_status: int | None = None
    """The HTTP status the backend answered with, when it answered."""


class BackendUnreachable(BackendCallError, BackendUnavailable):
    """Raised when the backend refuses the connection or its host can't be resolved."""


class BackendDropped(BackendCallError, BackendUnavailable):
    """Raised when the backend closes or breaks the connection before it answers."""


class BackendStatusError(BackendCallError, BackendUnavailable):
    """Raised when the backend answers a JSON call with a status other than 2xx."""


class BackendBadReply(BackendCallError, BackendUnavailable):
    """Raised when the backend's answer to a JSON call is not JSON, or not a JSON object."""


class BackendCallTimeout(BackendCallError, BackendTimeout):
    """Raised when the backend does not accept a connection within connect_s or answer within its time."""


_ERROR_TABLE: tuple[tuple[type[Exception], type[BackendCallError], str], ...] = (
    (aiohttp.ConnectionTimeoutError, BackendCallTimeout,
     "{where} did not accept a connection within {connect_s:g} s (timeouts.connect_s)"),
    (aiohttp.ClientConnectorError, BackendUnreachable, "{where} is unreachable: {reason}"),
    (aiohttp.ClientResponseError, BackendStatusError, "{where} answered HTTP {status}: {reason}"),
    (TimeoutError, BackendCallTimeout, "{where} sent no response within {waited}"),
    (aiohttp.ClientError, BackendDropped, "{where} failed before answering: {reason}"),
    (ValueError, BackendBadReply, "{where} answered with something that is not JSON: {reason}"),
)
"""First match wins: a ConnectionTimeoutError is also a TimeoutError and a ClientError, a ClientConnectorError a
ClientError, an orjson.JSONDecodeError a ValueError."""

TRANSPORT_ERRORS: tuple[type[Exception], ...] = tuple(kind for kind, _, _ in _ERROR_TABLE)


def call_error(exc: Exception, where: str, *, connect_s: float, waited: str) -> BackendCallError:
    """The gateway's error for a transport failure ``exc`` of a call described by ``where``; ``waited`` says how long
    an answer was waited for and which setting says so."""
    if isinstance(exc, BackendCallError):
        return exc
    for kind, error, template in _ERROR_TABLE:
        if isinstance(exc, kind):
            status = exc.status if isinstance(exc, aiohttp.ClientResponseError) else None
            reason = _reason(exc)
            made = error(template.format(where=where, connect_s=connect_s, waited=waited, status=status,
                                         reason=reason))
            made.backend_status = status
            return made
    raise TypeError(f"not a transport error: {exc!r}") from exc


def broken_off(exc: aiohttp.ClientError, where: str, what: str = "response") -> BackendDropped:
    """The gateway's error for a backend that broke off its ``what`` (response, stream) after it began answering."""
    return BackendDropped(f"{where} broke off the {what}: {_reason(exc)}")


def _reason(exc: Exception) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return exc.strerror or str(exc)
    if isinstance(exc, aiohttp.ClientResponseError):
        return exc.message
    return str(exc) or type(exc).__name__


@dataclass(frozen=True, slots=True)
class Call:
    """One whole request kvgate makes itself: its method, URL, headers and JSON body."""

    method: str
    url: URL
    headers: Mapping[str, str] | None = None
    json_body: Any = None


async def fetch(
    session: aiohttp.ClientSession, call: Call, *, where: str, timeouts: TimeoutSettings,
    timeout_s: float | None = None,
) -> bytes:
    """One whole request and answer: the body of a 2xx answer; BackendCallError for anything else. The answer must
    come whole within ``timeout_s`` (default ``timeouts.first_byte_s``); the connection within ``connect_s``."""
    method, url, headers, json_body = call.method, call.url, call.headers, call.json_body
    limit_s = timeouts.first_byte_s if timeout_s is None else timeout_s
    waited = f"{limit_s:g} s" + (" (timeouts.first_byte_s)" if timeout_s is None else "")
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s)
    try:
        async with asyncio.timeout(limit_s):
            async with session.request(method, url, headers=headers, json=json_body, timeout=client_timeout,
                                       allow_redirects=False) as response:
                if not 200 <= response.status < 300:
                    text = (await response.content.read(ERROR_TEXT_CHARS)).decode(errors="replace")
                    raise aiohttp.ClientResponseError(response.request_info, (), status=response.status,
                                                      message=text)
                return await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise call_error(exc, where, connect_s=timeouts.connect_s, waited=waited) from exc


def json_object(raw: bytes, where: str) -> dict[str, Any]:
    """``raw`` as a JSON object; BackendBadReply when it is not JSON or not an object."""
    try:
        data = orjson.loads(raw)
    except ValueError as exc:
        raise call_error(exc, where, connect_s=0.0, waited="") from exc  # timing plays no part here
    if not isinstance(data, dict):
        raise BackendBadReply(f"{where} answered JSON that is not an object: {raw[:80].decode(errors='replace')}")
    return data


# ---- the client -------------------------------------------------------------------------------------------------

SKIPPED_AUTO_HEADERS = frozenset(map(istr, ("User-Agent", "Accept", "Accept-Encoding")))
URL_CACHE = 256


class BackendClient:
    """Talks to one backend: its URL, its API key or its URL's credentials (sent on every call), its Host header and
    its timeouts. Its ``repr`` and ``label`` never show a key or a password."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        api_key: str | None = None,
        timeouts: TimeoutSettings | None = None,
        label: str | None = None,
        restart_wait_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._session = session
        given = URL(base_url)
        self.base_url = given.with_user(None)
        """Without the user and password: aiohttp refuses a URL with credentials beside an Authorization header
        (the client's, forwarded), and its errors may quote the URL."""
        credentials = f"{given.user or ''}:{given.password or ''}".encode()
        self._authorization = (f"Basic {base64.b64encode(credentials).decode()}"
                               if given.password is not None or given.user else None)
        """The URL's own credentials, sent as Basic auth on every call (a backend behind an authenticating proxy)."""
        self._api_key = api_key
        self.timeouts = timeouts or TimeoutSettings()
        self.label = label or str(self.base_url).rstrip("/")
        self.liveness = Liveness(restart_wait_s, clock)
        """When the backend last answered: whether a refused connection is a restart or a dead backend."""
        self._clock = clock
        self._sleep = sleep
        # per-request work done once (issue 26: each measured on its own, a few us a request together)
        self._skip = None if session.skip_auto_headers >= SKIPPED_AUTO_HEADERS else SKIPPED_AUTO_HEADERS
        """aiohttp's own headers kvgate never adds; passed per call only when the session does not skip them
        already (aiohttp rebuilds the set on every call it is passed to)."""
        self._client_timeout = (-1.0, aiohttp.ClientTimeout())
        self._urls: dict[str, URL] = {}
        self._identity = self._identity_headers()

    @classmethod
    def for_backend(
        cls, session: aiohttp.ClientSession, settings: BackendSettings, *, restart_wait_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> BackendClient:
        key = settings.api_key.get_secret_value() if settings.api_key else None
        return cls(session, settings.url, api_key=key, timeouts=settings.timeouts,
                   label=f"backend '{settings.name}' at {settings.shown_url}", restart_wait_s=restart_wait_s,
                   clock=clock)

    def __repr__(self) -> str:
        return f"BackendClient({self.label!r})"  # never the API key

    @property
    def host_header(self) -> str:
        return self.base_url.host_port_subcomponent or ""

    def identity(self) -> dict[str, str]:
        """The headers every call carries: Host, and the backend's API key (Bearer) or the credentials of its URL
        (Basic) when one is configured; either replaces a client's own Authorization."""
        return dict(self._identity)

    def _identity_headers(self) -> dict[str, str]:
        headers = {"Host": self.host_header}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif self._authorization is not None:
            headers["Authorization"] = self._authorization
        return headers

    def url_for(self, path_qs: str) -> URL:
        """The backend's URL for a request target as the client sent it (raw, percent-encoded): the configured
        scheme, host and port always, under the configured path. Built from parts, so no target (an absolute URL,
        ``//host``, ``@host``, a scheme without ``/``) can change the host; a fragment is dropped. The URLs of the
        last ``URL_CACHE`` targets are kept (clients send the same few routes)."""
        url = self._urls.get(path_qs)
        if url is None:
            if len(self._urls) >= URL_CACHE:
                self._urls.clear()
            url = self._urls[path_qs] = self._build_url(path_qs)
        return url

    def _build_url(self, path_qs: str) -> URL:
        base = self.base_url
        path, _, query = path_qs.partition("#")[0].partition("?")
        return URL.build(scheme=base.scheme, host=base.raw_host or "",
                         port=base.explicit_port, path=base.raw_path.rstrip("/") + "/" + path.lstrip("/"),
                         query_string=query, encoded=True)

    async def get_json(self, path: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """GET ``path``: its JSON object; BackendCallError when the call fails or the answer is not one."""
        return await self._object("GET", path, None, timeout_s)

    async def post_json(self, path: str, body: Any, *, timeout_s: float | None = None) -> dict[str, Any]:
        """POST ``body`` as JSON to ``path``: the answer's JSON object; BackendCallError as for get_json."""
        return await self._object("POST", path, body, timeout_s)

    async def request_json(self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None) -> Any:
        """Any JSON answer (llama-server's /slots is an array); BackendCallError when the call fails or the answer
        is not JSON."""
        where = self._where(method, path)
        raw = await self._fetch(method, path, body, where, timeout_s)
        try:
            return orjson.loads(raw)
        except ValueError as exc:
            raise call_error(exc, where, connect_s=self.timeouts.connect_s, waited="") from exc

    async def _object(self, method: str, path: str, body: Any, timeout_s: float | None) -> dict[str, Any]:
        where = self._where(method, path)
        return json_object(await self._fetch(method, path, body, where, timeout_s), where)

    def _where(self, method: str, path: str) -> str:
        return f"{method} {path} on {self.label}"

    async def _fetch(self, method: str, path: str, body: Any, where: str, timeout_s: float | None) -> bytes:
        # A JSON call's connection is closed after its answer. llama-server (cpp-httplib) gives each connection one
        # of its --threads-http threads until the client closes it or it has been idle 5 s, so a burst of counts
        # kept alive left the next ones waiting 5 s for a thread (measured: 2 of 12 concurrent counts at 5.07 s on
        # a 2-core machine, 1 run in 4; none in 8 runs with the connection closed).
        try:
            call = Call(method, self.url_for(path), self.identity() | {"Connection": "close"}, body)
            raw = await self.through_restart(lambda: fetch(self._session, call, where=where, timeouts=self.timeouts,
                                                           timeout_s=timeout_s))
        except BackendStatusError:
            self.liveness.answered()  # an error status is an answer: the backend is up
            raise
        self.liveness.answered()
        return raw

    async def through_restart(self, call: Callable[[], Awaitable[T]], *, wait: bool = True) -> T:
        """``call()``; a refused connection (BackendUnreachable) on a backend that was up within ``restart_wait_s``
        is a restart, tried again until it gets through or ``restart_wait_s`` have passed since the first refusal
        (liveness.py); on a backend that was not up (or with ``wait`` False), the refusal stands at once."""
        first_refused_s: float | None = None
        pause_s = RETRY_FIRST_S
        while True:
            try:
                return await call()
            except BackendUnreachable:
                now_s = self._clock()
                if first_refused_s is None:
                    if not wait or not self.liveness.up():
                        raise
                    first_refused_s = now_s
                    log.info("%s refused the connection but answered moments ago: waiting up to %g s for it "
                             "(a restart?)", self.label, self.liveness.restart_wait_s)
                if now_s + pause_s - first_refused_s > self.liveness.restart_wait_s:
                    raise
            await self._sleep(pause_s)
            pause_s = min(pause_s * 2, RETRY_MAX_S)

    async def open(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: Body, *, wait_restart: bool = True,
    ) -> aiohttp.ClientResponse:
        """Send a request and return the backend's response once its headers are in (the caller streams the body
        and closes it). Headers within ``first_byte_s``; a connection the backend closed before answering is
        tried once more when the body is held whole; a refused one is waited through when the backend was up
        moments ago (``through_restart``; only with ``wait_restart`` and a body held whole)."""
        sent = CIMultiDict(headers)
        for name, value in self._identity.items():
            sent[name] = value
        first_byte_s = self.timeouts.first_byte_s

        async def attempt() -> aiohttp.ClientResponse:
            try:
                async with asyncio.timeout(first_byte_s):
                    return await self._send(method, path_qs, sent, body)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise call_error(exc, self.label, connect_s=self.timeouts.connect_s,
                                 waited=f"{first_byte_s:g} s (timeouts.first_byte_s)") from None

        response = await self.through_restart(attempt, wait=wait_restart and isinstance(body, bytes | None))
        self.liveness.answered()
        return response

    async def _send(self, method: str, path_qs: str, headers: CIMultiDict[str], body: Body) -> aiohttp.ClientResponse:
        connect_s, client_timeout = self._client_timeout
        if connect_s != self.timeouts.connect_s:
            connect_s = self.timeouts.connect_s
            client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s)
            self._client_timeout = (connect_s, client_timeout)
        for attempt in (1, 2):
            try:
                return await self._session.request(
                    method, self.url_for(path_qs), headers=headers, data=body, timeout=client_timeout,
                    allow_redirects=False, skip_auto_headers=self._skip,
                )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # A pooled connection the server closed while idle (its keep-alive ran out as this request went
                # out): nothing was answered ("Server disconnected", or "Can not write request body"), so a body
                # kvgate holds whole is sent once more. A connection that could not be opened is not retried here.
                if attempt == 2 or not isinstance(body, bytes | None) or isinstance(exc, aiohttp.ClientConnectorError):
                    raise
                log.info("%s closed a kept-alive connection before answering; sending again", self.label)
        raise AssertionError("unreachable")
