"""The notice's words: one short line saying what kvgate left out or summarized, and the blank line after it (pure).

    [kvgate: 10 older messages were left out to fit the 8,192-token context]
    [kvgate: 4 older messages were replaced by a summary to fit the 2,048-token context]
    [kvgate: the middle of the prompt was left out to fit the 4,096-token context]
    [kvgate: part of a long message was left out to fit the 4,096-token context]

Only kvgate's own words and numbers: nothing a client sent is repeated in it.
"""

from __future__ import annotations

from gateway.admission.outcome import AdmissionOutcome


def _messages(n: int) -> str:
    return "1 older message was" if n == 1 else f"{n:,} older messages were"


def notice_line(outcome: AdmissionOutcome, context_tokens: int) -> str | None:
    """The line (with the blank line that follows it) for a request that was trimmed or summarized, else None."""
    if outcome.summary is not None:
        what = f"{_messages(outcome.summary.replaced_messages)} replaced by a summary"
    elif outcome.trim is None:
        return None
    elif outcome.trim.dropped_messages:
        what = f"{_messages(outcome.trim.dropped_messages)} left out"
    elif outcome.trim.of_messages:
        what = "part of a long message was left out"
    else:
        what = "the middle of the prompt was left out"
    return f"[kvgate: {what} to fit the {context_tokens:,}-token context]\n\n"
