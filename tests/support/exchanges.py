"""Exchanges (gateway/admission/exchange.py) as a request leaves them, for the tests of what observability renders
from them: the log line, the metrics, the recent decisions."""

from __future__ import annotations

from typing import cast

from aiohttp import web

from gateway.admission.exchange import Exchange, RequestFacts
from gateway.admission.outcome import AdmissionOutcome
from gateway.admission.tenant_keys import Tenant
from gateway.admission.types import PoolKey
from gateway.backends import Backend
from gateway.backends.client import BackendClient
from gateway.config.settings import BackendSettings, Settings
from gateway.domain import Dialect
from gateway.runtimes import runtime_for

SETTINGS = Settings()


def backend_named(name: str) -> Backend:
    """A backend known by its name only (nothing is sent to it); the name is not validated (odd bytes are the
    point of some tests)."""
    config = BackendSettings.model_construct(name=name)
    return Backend(config, cast(BackendClient, None), runtime=runtime_for(config.kind))


def ended(
    route: str = "/api/chat", status: int = 200, *, backend: str | None = None, tenant: str | None = "t",
    model: str | None = None, outcome: AdmissionOutcome | None = None, refusal: str | None = None,
    error: str | None = None, pool: PoolKey | None = None, request_id: str = "r",
) -> Exchange:
    """An exchange that ended with ``status``; ``backend`` None: no backend was chosen; ``tenant`` None: a bad key."""
    facts = RequestFacts(request_id=request_id, method="POST", path=route, route_label=route, dialect=Dialect.OLLAMA,
                         settings=SETTINGS, started_s=0.0, tenant=None if tenant is None else Tenant(tenant))
    exchange = Exchange(facts, cast(web.Request, None))
    exchange.backend = None if backend is None else backend_named(backend)
    exchange.model, exchange.outcome, exchange.refusal, exchange.error = model, outcome, refusal, error
    exchange.pool, exchange.status = pool, status
    return exchange
