"""What a request leaves behind once it is over, rendered from its exchange (gateway/admission/exchange.py): the
one log line (request_log.py), the metrics (metrics.record), the recent decisions of the status page and the
longest prompts seen. The proxy calls ``finish`` once per request, whatever its end."""

from __future__ import annotations

import logging

from gateway.admission.exchange import Exchange
from gateway.observability.logs import ClientText
from gateway.observability.metrics import Metrics, record
from gateway.observability.request_log import request_fields

log = logging.getLogger("gateway.proxy")
"""The request log line has always been the proxy's (operators filter on this logger's name)."""


def finish(metrics: Metrics, exchange: Exchange, elapsed_s: float) -> None:
    """Log, count and keep the request's decision, once."""
    if log.isEnabledFor(logging.INFO):  # the fields are built only for a line that is written
        facts = exchange.facts
        detail: dict[str, object] = {"tenant": exchange.tenant_label}
        if exchange.error is not None:
            detail["error"] = exchange.error
        detail.update(request_fields(exchange))
        log.info("%s %s %d", facts.method, ClientText(facts.path), exchange.status,
                 extra={"duration_ms": round(elapsed_s * 1000, 2), **detail})
    record(metrics, exchange, elapsed_s)
    metrics.recent_decisions.add(exchange)
    if exchange.count is not None:
        metrics.longest_prompts.see(exchange.backend_name, "-" if exchange.model is None else exchange.model,
                                    exchange.count.tokens, exchange.count.exact)
