"""The status page's recent decisions (gateway/observability/decisions.py): one entry per decided request, the most
telling decision named, kvgate's reasons kept, bounded memory, safe text."""

from __future__ import annotations

import pytest

from gateway.admission.outcome import AdmissionOutcome, Reserved, SummaryNote, Trim
from gateway.admission.types import PoolKey
from gateway.observability.decisions import MAX_NAME_CHARS, MAX_REASON_CHARS, DecisionLog, describe
from gateway.tokens import TokenCount
from tests.support.exchanges import ended

COUNT = TokenCount(1200, "llama-server", True)
POOL = PoolKey("cpp", "llama3.1:8b")
HELD = Reserved(POOL, 2200, 1)


@pytest.mark.parametrize(("outcome", "refusal", "error", "expected"), [
    (None, None, None, None),  # no admission and no refusal (a listing, a backend error): no decision
    (None, "queue_full", "3 requests are already waiting", ("refused", "queue_full: 3 requests are already waiting")),
    (None, "rate_limited", None, ("refused", "rate_limited")),
    (AdmissionOutcome(COUNT, reserved=HELD), None, None, ("admitted", "1,200 prompt tokens (llama-server)")),
    (AdmissionOutcome(COUNT), None, None,
     ("admitted", "1,200 prompt tokens (llama-server); forwarded without a pool (admission off, or no KV layout "
                  "known)")),
    (AdmissionOutcome(COUNT, reserved=HELD, waited_s=1.5), None, None,
     ("queued", "1,200 prompt tokens (llama-server); waited 1.50 s")),
    (AdmissionOutcome(COUNT, reserved=HELD, waited_s=0.5, rewrites=("max_tokens=1000 (was 9000)",)), None, None,
     ("clamped", "1,200 prompt tokens (llama-server); waited 0.50 s; max_tokens=1000 (was 9000)")),
    (AdmissionOutcome(COUNT, reserved=HELD, trim=Trim(4, 10, 5000, 1200)), None, None,
     ("trimmed", "1,200 prompt tokens (llama-server); dropped the 4 oldest of 10 messages; prompt 5,000 -> 1,200 "
                 "tokens")),
    (AdmissionOutcome(COUNT, reserved=HELD, summary=SummaryNote(6, 10, 5000, 1200, cached=True),
                      notes=("a note",)), None, None,
     ("summarized", "1,200 prompt tokens (llama-server); replaced the 6 oldest of 10 messages with a summary; "
                    "prompt 5,000 -> 1,200 tokens; cached; a note")),
], ids=["nothing", "refused", "refused-bare", "admitted", "no-pool", "queued", "clamped", "trimmed", "summarized"])
def test_describe(outcome: AdmissionOutcome | None, refusal: str | None, error: str | None,
                  expected: tuple[str, str] | None) -> None:
    assert describe(outcome, refusal, error) == expected


def test_the_log_keeps_the_newest_within_its_bound_with_safe_text() -> None:
    log = DecisionLog(keep=3, wall_clock=lambda: 1700000000.0)
    assert log.add(ended(request_id="r0")) is False  # no outcome, no refusal: nothing kept
    for i in range(5):
        log.add(ended(request_id=f"r{i}", tenant="ci\udcff", backend="cpp",
                      outcome=AdmissionOutcome(COUNT, reserved=HELD)))
    log.add(ended(status=503, request_id="r9", tenant="web", backend="cpp", model="llama3.1:8b", refusal="queue_full",
                  error="x" * 2000))
    recent = log.snapshot()
    assert [e["request_id"] for e in recent] == ["r9", "r4", "r3"]
    assert recent[0]["decision"] == "refused" and len(recent[0]["reason"]) == MAX_REASON_CHARS
    assert recent[1] == {"at_s": 1700000000.0, "request_id": "r4", "tenant": "ci\ufffd", "backend": "cpp",
                         "model": "llama3.1:8b", "decision": "admitted", "reason": "1,200 prompt tokens (llama-server)",
                         "status": 200, "reserved_tokens": 2200, "waited_s": 0.0}


def test_an_entry_holds_no_more_of_a_clients_strings_than_the_page_shows() -> None:
    """A model name is the client's own string, of any length: the log keeps 200 entries, each cut as it is added."""
    log = DecisionLog(keep=2, wall_clock=lambda: 1700000000.0)
    log.add(ended(request_id="r1", backend="cpp", model="m" * 1_000_000, refusal="queue_full", error="e" * 1_000_000))
    kept = max(len(value) for value in log._recent[0] if isinstance(value, str))
    (shown,) = log.snapshot()
    print(f"longest string kept: {kept:,} characters; shown: model {len(shown['model'])}, "
          f"reason {len(shown['reason'])}")
    assert kept <= MAX_REASON_CHARS
    assert (len(shown["model"]), len(shown["reason"])) == (MAX_NAME_CHARS, MAX_REASON_CHARS)
