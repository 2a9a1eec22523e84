"""One exchange per request: what the request is, frozen, and what the path learns about it, in one place.

    Exchange
      facts      RequestFacts, frozen at the edge: id, method, path, route, dialect, tenant, the settings snapshot
                 the request runs under, its deadline, when it started
      body       RequestBody, frozen once read and parsed: the ParsedRequest, the raw bytes, the headers kvgate adds
                 for what it changed on the way in (client keep_alive)
      learned    set as the path goes, each once: the backend, the model as the backend names it, the pool, the
                 prompt's count, the admission outcome, the rate charge, the usage the reply reported, the refusal

The proxy makes one per request (``Exchange.begin``), the admission step reads it, and observability renders the
log line, the metrics and the recent decisions from it when the request is over (``observability/exchange_log.py``).

It lives in ``admission`` because what it learns is admission's (the count, the outcome, the pool, the rate
charge) and admission, routing, observability and the proxy above all read it; nothing below admission needs it.
It holds the aiohttp request only as an opaque handle for the layers that answer it (the proxy, streaming): the
admission step asks it one question, whether the client is still there (``client_gone``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.admission.charging import ReportedUsage
from gateway.admission.outcome import AdmissionOutcome
from gateway.admission.rate_charge import RateCharge
from gateway.admission.tenant_keys import Tenant
from gateway.admission.types import PoolKey
from gateway.config.settings import Settings
from gateway.domain import Dialect, ParsedRequest
from gateway.tokens import TokenCount

if TYPE_CHECKING:  # the layers above: read only by the type checker
    from aiohttp import web

    from gateway.backends import Backend

UNIDENTIFIED = "-"
"""The tenant label of a request whose key named no tenant (a bad key)."""
NO_BACKEND = "-"
"""The backend label of a request that did not reach one (a refusal before routing, a bad body)."""


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the request is, known before its body is read; never changes."""

    request_id: str
    method: str
    path: str
    route_label: str
    """The route's path in the table ("other" for the fallback): a bounded metrics label."""
    dialect: Dialect
    settings: Settings
    """The configuration this request runs under, whatever reloads meanwhile."""
    started_s: float
    tenant: Tenant | None = None
    """Who is asking; None until the key names one (a request with a bad key stays unidentified)."""


@dataclass(frozen=True, slots=True)
class RequestBody:
    """The request's body, read once and parsed once; ``raw`` is what is forwarded when nothing is changed."""

    parsed: ParsedRequest
    raw: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    """Response headers naming what kvgate changed on the way in (``X-Kvgate-Keep-Alive``)."""


@dataclass(slots=True)
class Exchange:
    facts: RequestFacts
    http: web.Request
    body: RequestBody | None = None
    backend: Backend | None = None
    """The backend the request is being served by (the last one tried)."""
    asked_model: str | None = None
    """The model the client named, for the log line until the backend's own name for it is known."""
    model: str | None = None
    """The model as the backend names it ("" for a server's one pool); None until it is known."""
    pool: PoolKey | None = None
    count: TokenCount | None = None
    outcome: AdmissionOutcome | None = None
    rate_charge: RateCharge | None = None
    """What the tenant's rate was charged up front (once per request), settled when it ends."""
    usage: ReportedUsage | None = None
    """What the reply reported or streamed (for the settlement, the output tokens and truncation checks)."""
    deadline: tuple[float, str] | None = None
    """The client's own limit on its wait (seconds, and the header that set it), read when admission needs it."""
    output_tokens: int | None = None
    streamed_tokens: int | None = None
    """Output tokens an elastic reply streamed (its events), as kvgate counted them."""
    elastic_end: str | None = None
    """Why kvgate ended an elastic reply before the backend did (``admission.elastic``); None: it did not."""
    refusal: str | None = None
    """Why kvgate refused it, as a bounded label (``tenant_usage.refusal_reason``)."""
    summary_failure: str | None = None
    content: str | None = None
    """The last user message, only with ``server.log_contents``."""
    status: int = 0
    error: str | None = None

    def identified(self, tenant: Tenant) -> None:
        """The tenant the request's key names (once, before anything else is learned)."""
        facts = self.facts  # built field by field: dataclasses.replace costs ~10 us, and this runs on every request
        self.facts = RequestFacts(facts.request_id, facts.method, facts.path, facts.route_label, facts.dialect,
                                  facts.settings, facts.started_s, tenant)

    @property
    def tenant(self) -> Tenant:
        assert self.facts.tenant is not None, "the tenant is identified before the request is served"
        return self.facts.tenant

    @property
    def tenant_label(self) -> str:
        """The tenant for logs and metrics: "-" while unidentified."""
        return UNIDENTIFIED if self.facts.tenant is None else self.facts.tenant.name

    @property
    def parsed(self) -> ParsedRequest:
        assert self.body is not None, "the exchange's body is read before it is admitted"
        return self.body.parsed

    @property
    def backend_name(self) -> str:
        return NO_BACKEND if self.backend is None else self.backend.name

    @property
    def model_label(self) -> str | None:
        """The model for the log line: the backend's name for it once known, else the client's."""
        return self.asked_model if self.model is None else self.model

    def client_gone(self) -> bool:
        """Whether the client closed its connection (a queued request then leaves the queue)."""
        transport = self.http.transport
        return transport is None or transport.is_closing()
