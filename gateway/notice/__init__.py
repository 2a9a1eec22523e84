"""``fitting.notice``: the person at the keyboard learns what kvgate left out, in the reply itself (issue 22, point 7).

A request kvgate trimmed or summarized to fit its context gets one short line at the start of the assistant's reply
(``text.notice_line``), followed by a blank line, in the client's own framing: the text of a whole JSON reply, or one
extra event of a stream (``stream.NoticeStream``). Off by default; per tenant and per model like every fitting
setting. Which replies carry it, and where, is ``shapes``. The line is no generated text: usage figures are the
backend's, unchanged.

    proxy: reply_notice(parsed, outcome, context, policy) -> Notice | None --> streaming.relay(notice=...)
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.admission.outcome import AdmissionOutcome
from gateway.domain import ParsedRequest
from gateway.notice.shapes import Shape, add_to_reply, shape_of, withheld
from gateway.notice.stream import NoticeStream
from gateway.notice.words import notice_line

__all__ = ["Notice", "NoticeStream", "reply_notice"]


@dataclass(frozen=True, slots=True)
class Notice:
    """The line one reply gets, and where its route carries text."""

    shape: Shape
    line: str
    choices: int = 1

    def rewrite_body(self, raw: bytes) -> bytes | None:
        """A whole JSON reply with the line in front of its first text; None when it has none (or is no JSON)."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not add_to_reply(self.shape, body, self.line):
            return None
        try:
            return orjson.dumps(body)
        except TypeError:  # what orjson reads it can mostly write; a number past 64 bits it can't: leave it
            return None

    def stream(self, kind: str) -> NoticeStream | None:
        """The stream rewriter for a reply framed as ``kind`` (NDJSON or SSE), or None for a framing the route does
        not use."""
        if kind != NoticeStream.framing_of(self.shape):
            return None
        return NoticeStream(self.shape, self.line, kind, self.choices)


def reply_notice(parsed: ParsedRequest, outcome: AdmissionOutcome, context_tokens: int, *, enabled: bool,
                 ) -> Notice | None:  # fmt: skip
    """The notice of an admitted request: only with ``fitting.notice`` on, for a request trimmed or summarized, on a
    route whose reply is prose (``shapes.withheld``)."""
    if not enabled:
        return None
    line = notice_line(outcome, context_tokens)
    shape = shape_of(parsed)
    if line is None or shape is None or withheld(parsed) is not None:
        return None
    return Notice(shape, line, parsed.sequences)
