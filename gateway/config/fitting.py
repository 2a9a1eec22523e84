"""What kvgate does with a chat or a prompt too long for the model's context: the fitting policy's settings.

``[fitting]`` holds the defaults; ``[models."NAME".fitting]`` and ``[tenants.NAME.fitting]`` override any of its
fields, the tenant's last (``gateway.fitting.policy.policy_for`` resolves them):

    remedies               in order, the first that works: "summarize" (replace the oldest turns with a summary),
                           "trim" (drop the oldest turns; a prompt keeps its head and tail), "refuse" (400)
    keep_newest_turns      turns never summarized (the newest, verbatim); trimming keeps at least the newest
    summary_model          the model that writes summaries (any model a backend serves; the same or a smaller one)
    summary_backend        the backend to ask, when not the one the model name routes to
    summary_instructions   the summarizer's instructions
    summary_max_tokens     its output budget
    summary_timeout_s      how long a summary may take before kvgate trims instead
    strict                 change nothing: refuse what does not fit
    notice                 add one line in front of the reply saying what was trimmed or summarized (gateway.notice)
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from gateway.config.base import Strict

Remedy = Literal["summarize", "trim", "refuse"]
DEFAULT_INSTRUCTIONS = (
    "Summarize the conversation so far for the assistant who will continue it: the user's goals and constraints, "
    "decisions made, facts, names, numbers and code that matter later, and open questions. Be concise; write only "
    "the summary."
)


def _remedies(value: tuple[Remedy, ...] | None) -> tuple[Remedy, ...] | None:
    if value is None:
        return None
    if not value:
        raise ValueError('name at least one remedy: "summarize", "trim" or "refuse"')
    if len(set(value)) != len(value):
        raise ValueError(f"each remedy at most once: {list(value)}")
    return value


class FittingOverrideSettings(Strict):
    """A model's or a tenant's changes to ``[fitting]``: only the fields it sets."""

    remedies: tuple[Remedy, ...] | None = None
    keep_newest_turns: int | None = Field(default=None, ge=1)
    summary_model: str | None = None
    summary_backend: str | None = None
    summary_instructions: str | None = None
    summary_max_tokens: int | None = Field(default=None, ge=16)
    summary_timeout_s: float | None = Field(default=None, gt=0)
    strict: bool | None = None
    notice: bool | None = None

    _check_remedies = field_validator("remedies")(classmethod(lambda cls, value: _remedies(value)))


class FittingSettings(Strict):
    """The fitting policy's defaults (see the module docstring)."""

    remedies: tuple[Remedy, ...] | None = Field(
        default=None, description='in order: "summarize", "trim", "refuse"; unset: admission.on_too_long decides',
    )
    keep_newest_turns: int = Field(default=2, ge=1, description="the newest turns a summary never replaces")
    summary_model: str | None = Field(default=None, description="the model that writes summaries")
    summary_backend: str | None = Field(default=None, description="the backend that serves it, if not routed")
    summary_instructions: str = DEFAULT_INSTRUCTIONS
    summary_max_tokens: int = Field(default=512, ge=16, description="the summary's output budget")
    summary_timeout_s: float = Field(default=60.0, gt=0, description="a slower summary is given up: trimmed instead")
    summary_cache_entries: int = Field(default=1024, ge=1, description="summaries kept for the next turns")
    strict: bool = Field(default=False, description="refuse what does not fit; change nothing")
    notice: bool = Field(default=False, description="a line in front of the reply says what was trimmed or "
                         "summarized (not for tool calls or structured output)")

    _check_remedies = field_validator("remedies")(classmethod(lambda cls, value: _remedies(value)))
