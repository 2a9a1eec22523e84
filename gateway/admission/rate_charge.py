"""What a request is charged against its tenant's tokens per minute, up front and once it has ended (pure).

    up front   the prompt + the output it may generate (its max_tokens / num_predict, lowered to the tenant's
               max_output_tokens, else admission.default_output_tokens; none for an embedding), taken before it is
               admitted, so 12 concurrent requests can't each pass on their prompt alone and generate 12 minutes
               of output at once. Capped at a whole minute's tokens (a client asking for more output than a minute
               holds is charged the minute and waits for a full bucket, not refused); a counted prompt alone over
               the minute is still refused (400), an estimated one is charged at most the minute
    settled    when the response ends, the output is settled to what it really was, the difference refunded (or
               charged) at once:

        the backend reported its output length (usage)       that length
        none came, but a stream sent chunks                  one token per chunk sent (NDJSON lines, SSE events):
                                                             a stream cut before its last chunk (the client left,
                                                             the backend broke off) is charged for what it sent
        none came, nothing streamed, 200 or client gone      the reserved output stays charged
        none came, nothing streamed, an error or a refusal   nothing: the output is refunded

The prompt stays charged whatever happens (it was sent, or a refusal was asked for).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.admission.rates import RateLimit

CLIENT_GONE = 499


@dataclass(frozen=True, slots=True)
class RateCharge:
    """What was taken from ``tenant``'s buckets for one request: ``prompt_tokens`` and ``output_tokens`` (reserved)."""

    tenant: str
    limit: RateLimit
    prompt_tokens: int
    output_tokens: int

    @property
    def counts_tokens(self) -> bool:
        return self.limit.tokens_per_minute is not None


def upfront(prompt_tokens: int, exact: bool, reserved_output_tokens: int, per_minute: int | None) -> tuple[int, int]:
    """The prompt and output tokens to take up front (module docstring)."""
    if per_minute is None:
        return prompt_tokens, 0
    if not exact:
        prompt_tokens = min(prompt_tokens, per_minute)
    if prompt_tokens > per_minute:
        return prompt_tokens, 0  # refused for good by the bucket: the prompt alone is more than a minute
    return prompt_tokens, max(0, min(reserved_output_tokens, per_minute - prompt_tokens))


def output_used(charge: RateCharge, reported_tokens: int | None, streamed_chunks: int, status: int) -> int:
    """The output tokens the request really used, as far as kvgate can tell (module docstring's table)."""
    if reported_tokens is not None:
        return reported_tokens
    if streamed_chunks > 0:
        return streamed_chunks
    return charge.output_tokens if status in (200, CLIENT_GONE) else 0


def settlement(charge: RateCharge, reported_tokens: int | None, streamed_chunks: int, status: int) -> int:
    """Tokens to take now (negative: to give back) so that the request is charged what it used."""
    return output_used(charge, reported_tokens, streamed_chunks, status) - charge.output_tokens
