"""Backends at run time: their model lists, refreshed periodically and on a miss, and routing by model name."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from yarl import URL

from gateway.backends.client import BackendCallError, BackendClient, BackendUnreachable
from gateway.backends.model_names import find_model
from gateway.backends.runtime_port import BackendRuntime
from gateway.config.settings import BackendSettings, Settings
from gateway.domain import BackendKind
from gateway.errors import InvalidField, ModelNotFound
from gateway.support.safe_text import sanitize
from gateway.support.single_flight import SingleFlight

log = logging.getLogger(__name__)

MISS_REFRESH_MIN_INTERVAL_S = 2.0
"""A burst of requests for an unknown model refreshes the lists at most this often."""
LISTING_ANSWER_S = 10.0
"""A model list must come whole within this long after the connection (``timeouts.connect_s``)."""


@dataclass(eq=False)
class Backend:
    """One configured backend and what it was last seen serving."""

    settings: BackendSettings
    client: BackendClient
    runtime: BackendRuntime = field(kw_only=True)
    """What its kind of server does (gateway/runtimes/, through backends/runtime_port.py)."""
    models: frozenset[str] = frozenset()
    listed_at_s: float | None = None
    last_error: str | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _described: tuple[BackendSettings, str] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def kind(self) -> BackendKind:
        return self.settings.kind

    @property
    def base_url(self) -> URL:
        return self.client.base_url

    @property
    def host_header(self) -> str:
        return self.client.host_header

    @property
    def api_key(self) -> str | None:
        return self.settings.api_key.get_secret_value() if self.settings.api_key else None

    def url_for(self, path_qs: str) -> URL:
        """The backend's URL for a request target as the client sent it (``BackendClient.url_for``)."""
        return self.client.url_for(path_qs)

    def serves(self, model: str) -> bool:
        return self.listed_name(model) is not None

    def listed_name(self, model: str) -> str | None:
        """The name the backend lists ``model`` under (Ollama's ``x`` is ``x:latest``), None when not listed."""
        return find_model(model, self.models)

    def describe(self) -> str:
        """``backend 'name' at url`` (password masked), built once per settings: every relay names it."""
        settings, described = self.settings, self._described
        if described is None or described[0] is not settings:
            described = self._described = (settings, f"backend '{settings.name}' at {settings.shown_url}")
        return described[1]


class BackendRegistry:
    """Knows every backend and which one serves a model; owns no session (it is injected)."""

    def __init__(self, settings: Settings, session: aiohttp.ClientSession, clock: Callable[[], float] = time.monotonic,
                 *, runtime_for: Callable[[BackendKind], BackendRuntime]):
        self._settings = settings
        self._clock = clock
        self.backends = [  # a refused connection waits for a backend up within probe_wait_s (liveness.py)
            Backend(config, BackendClient.for_backend(session, config, restart_wait_s=settings.admission.probe_wait_s,
                                                      clock=clock), runtime=runtime_for(config.kind))
            for config in settings.backends]
        self._miss_refresh: SingleFlight[str, None] = SingleFlight(clock=clock)

    @property
    def default(self) -> Backend:
        return self.by_name(self._settings.default.name)

    def by_name(self, name: str) -> Backend:
        return next(backend for backend in self.backends if backend.name == name)

    def default_for(self, kind: BackendKind | None) -> Backend:
        """The default backend, or the first of a kind when a route belongs to that kind of server."""
        default = self.default
        if kind is None or default.kind is kind:
            return default
        return next((backend for backend in self.backends if backend.kind is kind), default)

    async def fetch_listing(self, backend: Backend) -> dict[str, Any]:
        """GET the backend's model list and keep its names; raises BackendCallError for the caller to handle."""
        timeout_s = backend.settings.timeouts.connect_s + LISTING_ANSWER_S
        listing = await backend.client.get_json(backend.runtime.list_path, timeout_s=timeout_s)
        backend.models = backend.runtime.model_names(listing)
        backend.listed_at_s = self._clock()
        backend.last_error = None
        return listing

    async def refresh(self, backend: Backend, *, min_age_s: float = 0.0) -> None:
        """Refresh one backend's model list, keeping the old one if the backend can't be reached; a list younger
        than ``min_age_s`` is kept (a burst of requests for unknown names lists once, not once each), and so is
        one read while this call waited for another to finish."""
        asked_at_s = self._clock()
        async with backend._lock:
            listed_at_s = backend.listed_at_s
            if listed_at_s is not None and (self._clock() - listed_at_s < min_age_s or listed_at_s > asked_at_s):
                return
            try:
                await self.fetch_listing(backend)
            except BackendCallError as exc:
                backend.last_error = exc.message
                log.warning("could not list models: %s%s", backend.last_error,  # it names the backend
                            _loopback_hint(backend, exc))

    async def aclose(self) -> None:
        """End a shared listing still in flight (at shutdown)."""
        await self._miss_refresh.aclose()

    async def refresh_all(self, backends: Iterable[Backend] | None = None) -> None:
        await asyncio.gather(*(self.refresh(backend) for backend in backends or self.backends))

    async def resolve(self, model: str | None, kind: BackendKind | None = None) -> Backend:
        """The backend serving ``model``; on a miss, refresh the lists, then fall back to the default. Misses share
        one refresh: those during it wait for it (never routed before the lists are read), and those within
        ``MISS_REFRESH_MIN_INTERVAL_S`` after it use its lists."""
        if model is None:
            return self.default_for(kind)
        found = self._find(model)
        if found is None:
            await self._miss_refresh.run("all", self.refresh_all, max_age_s=MISS_REFRESH_MIN_INTERVAL_S)
            found = self._find(model)
        return found or self.default_for(kind)

    async def serving(self, model: str | None, kind: BackendKind | None = None) -> list[Backend]:
        """Every backend that serves ``model``, in configuration order (those of ``kind`` when some are), for
        routing between them (gateway/routing/); the default alone when none does (``resolve``)."""
        found = [] if model is None else [backend for backend in self.backends if backend.serves(model)]
        if not found:
            fallback = await self.resolve(model, kind)  # refreshes the lists on a miss
            found = [] if model is None else [backend for backend in self.backends if backend.serves(model)]
            if not found:
                return await self._replicas_of(fallback)
        of_kind = [backend for backend in found if backend.kind is kind]
        return of_kind or found

    async def _replicas_of(self, fallback: Backend) -> list[Backend]:
        """A request that names no model (or one nobody lists) goes to ``fallback``. A llama-server runs its one model
        whatever a request names, so every llama-server listing the same models shares such requests with it."""
        if not fallback.runtime.serves_one_model or len(self.backends) == 1:
            return [fallback]
        if fallback.listed_at_s is None:
            await self._miss_refresh.run("all", self.refresh_all, max_age_s=MISS_REFRESH_MIN_INTERVAL_S)
        if not fallback.models:
            return [fallback]
        return [fallback] + [b for b in self.backends if b is not fallback and b.kind is fallback.kind
                             and b.models == fallback.models]

    async def target_model(self, backend: Backend, model: str | None) -> str:
        """The model the backend will actually run for a request that names ``model``.

        llama-server serves one model whatever a request says: "" (its pool is the server's). Ollama runs the
        model it lists under that name; a model it does not list (after refreshing the list) is a 404, so made-up
        names never reach the backend or make pools. OpenAI-compatible servers: the name as given."""
        if backend.runtime.serves_one_model:
            return ""
        if model is None:
            raise InvalidField("model", f"field 'model' is required: name the model to use on {backend.describe()}")
        if not backend.runtime.needs_listed_model:
            return model
        listed = backend.listed_name(model)
        if listed is None:
            await self.refresh(backend, min_age_s=MISS_REFRESH_MIN_INTERVAL_S)
            listed = backend.listed_name(model)
        if listed is not None:
            return listed
        if backend.listed_at_s is None:  # the list could not be read: the pool probe decides
            return model
        raise ModelNotFound(f"model '{sanitize(model)}' not found on {backend.describe()}; it serves "
                            f"{_some(backend.models)}; pull it first or pick one of those")

    def _find(self, model: str) -> Backend | None:
        return next((backend for backend in self.backends if backend.serves(model)), None)

    async def run_refresh_loop(self) -> None:
        """Refresh every backend's model list every ``models_refresh_s`` until cancelled."""
        while True:
            await self.refresh_all()
            await asyncio.sleep(self._settings.models_refresh_s)


def _some(names: frozenset[str], shown: int = 8) -> str:
    ordered = sorted(name for name in names if not name.endswith(":latest") or name[:-7] not in names)
    if not ordered:
        return "no models"
    more = f" and {len(ordered) - shown} more" if len(ordered) > shown else ""
    return ", ".join(repr(name) for name in ordered[:shown]) + more


def _loopback_hint(backend: Backend, error: BackendCallError) -> str:
    """For a loopback backend that can't be reached: in a container, loopback is the container itself."""
    if not isinstance(error, BackendUnreachable) or URL(backend.settings.url).host not in ("127.0.0.1", "localhost",
                                                                                           "::1"):
        return ""
    return ("; if kvgate runs in a container, 127.0.0.1 is the container itself: point it at the server, e.g. "
            "KVGATE_BACKEND__URL=http://ollama:11434")
