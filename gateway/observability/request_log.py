"""The one log line each proxied request ends with, rendered from what the request path learned (no I/O here).

    msg            "METHOD PATH STATUS"                 request_id    from the context (logs.RequestIdFilter)
    tenant         the tenant's name ("-": a bad key)   backend       the backend chosen ("-": none was)
    model          the model the client named (cut)     status        the HTTP status (499: the client left)
    decision       admitted | admitted_after_wait | forwarded_without_pool (outcome.AdmissionDecision), refused
                   (with ``reason``: tenant_usage.refusal_reason), forwarded (no admission: a listing, a passthrough
                   route, a request that allocates no KV), error (kvgate or the backend failed, or a bad request)
    actions        what admission did on top: rewritten (num_ctx or the output limit clamped), trimmed, summarized,
                   queued (outcome.decision_labels)
    prompt_tokens, counter, exact                       the count (after any trim), and whether it was exact
    reserved_tokens, queue_wait_s                       what it held in its pool, and how long it waited first
    duration_ms, error                                  added by the proxy

Never a key, a header or a body. ``server.log_contents = true`` (unsafe, off by default) adds ``content``: the last
user message (or the prompt), cut to ``CONTENT_CHARS``; the formatters escape it like every other field.
"""

from __future__ import annotations

from typing import Any

from gateway.admission.exchange import Exchange
from gateway.admission.outcome import decision_labels, log_fields
from gateway.domain import ParsedRequest
from gateway.support.safe_text import sanitize

CONTENT_CHARS = 200
"""How much of a message ``server.log_contents`` logs."""


def request_fields(exchange: Exchange) -> dict[str, object]:
    """The fields of a request's log line (see the module docstring): the prompt's count when admission did not
    finish (a refusal), ``content`` only when ``server.log_contents`` is on."""
    model, outcome, count = exchange.model_label, exchange.outcome, exchange.count
    fields: dict[str, object] = {"status": exchange.status, "backend": exchange.backend_name,
                                 "model": sanitize(model) if model else "-"}
    if outcome is not None:
        fields.update(log_fields(outcome))
        fields["actions"] = list(decision_labels(outcome))
    else:
        if count is not None:
            fields.update(prompt_tokens=count.tokens, counter=count.counter, exact=count.exact)
        fields["decision"] = "refused" if exchange.refusal else ("error" if exchange.status >= 400 else "forwarded")
    if exchange.refusal:
        fields["reason"] = exchange.refusal
    if exchange.elastic_end is not None:
        fields["ended_by_kvgate"] = exchange.elastic_end
    if exchange.content is not None:
        fields["content"] = exchange.content
    return fields


def _text(content: Any) -> str | None:
    """A message's text: a string, or the text parts of a list of parts (OpenAI, Anthropic)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
        return " ".join(texts) if texts else None
    return None


def logged_content(parsed: ParsedRequest) -> str | None:
    """What ``server.log_contents`` logs of a request: its last user message, else its text prompt; cut."""
    text: str | None = None
    for message in reversed(parsed.prompt_input.messages or ()):
        if message.get("role") == "user":
            text = _text(message.get("content"))
            break
    if text is None and isinstance(parsed.prompt_input.text, str):
        text = parsed.prompt_input.text
    if text is None:
        return None
    return text[:CONTENT_CHARS] + ("..." if len(text) > CONTENT_CHARS else "")
