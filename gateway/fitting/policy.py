"""The fitting policy of one request: ``[fitting]``, then its model's overrides, then its tenant's (pure).

A request too long for the context meets its policy's remedies in order (``gateway.admission.admit``):

    summarize   the oldest turns become one summary message (``gateway.fitting.summary_fit``), written by
                ``summary_model``; skipped for a request that has no turns to spare, for kvgate's own summary
                requests (never summarized themselves), and when no summary model is configured
    trim        the oldest whole turns are dropped (``gateway.fitting.trim``); a prompt (/api/generate,
                /v1/completions) keeps its head and tail around a marker (``gateway.fitting.head_tail``)
    refuse      400 ``context_length_exceeded``, naming the prompt's tokens and the context

``strict`` refuses at once: nothing a client sent is changed. Without ``[fitting] remedies``, the older
``admission.on_too_long`` decides: "trim" (trim, then refuse) or "reject" (refuse).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.backends.model_names import find_model
from gateway.config.fitting import FittingOverrideSettings, Remedy
from gateway.config.settings import Settings


@dataclass(frozen=True, slots=True)
class FitPolicy:
    remedies: tuple[Remedy, ...]
    keep_newest_turns: int
    summary_model: str | None
    summary_backend: str | None
    summary_instructions: str
    summary_max_tokens: int
    summary_timeout_s: float
    strict: bool = False
    notice: bool = False
    """Tell the person too: a line in front of the reply saying what was trimmed or summarized (gateway.notice)."""

    def effective_remedies(self) -> tuple[Remedy, ...]:
        """The remedies tried, in order, up to the first "refuse" (refusal ends every list)."""
        if self.strict:
            return ()
        tried: list[Remedy] = []
        for remedy in self.remedies:
            if remedy == "refuse":
                break
            if remedy == "summarize" and self.summary_model is None:
                continue
            tried.append(remedy)
        return tuple(tried)

    def without_summaries(self) -> FitPolicy:
        """The policy of kvgate's own summary requests: never summarized or cut themselves (a summary of a transcript
        cut in the middle would leave its middle out without saying so: the request is refused, and the summary falls
        back as for any failure, ``too_long``), and no notice in the summary."""
        return replace(self, remedies=("refuse",), notice=False)


def _apply(policy: FitPolicy, overrides: FittingOverrideSettings) -> FitPolicy:
    changes = {name: value for name, value in overrides.model_dump().items() if value is not None}
    if "remedies" in changes:
        changes["remedies"] = tuple(changes["remedies"])
    return replace(policy, **changes)


def policy_for(settings: Settings, *, tenant: str | None = None, model: str | None = None) -> FitPolicy:
    """``[fitting]``, then ``[models."<model>".fitting]`` (the name as sent, or its ``:latest`` twin), then
    ``[tenants.<tenant>.fitting]``."""
    base = settings.fitting
    remedies: tuple[Remedy, ...] = base.remedies or (
        ("trim", "refuse") if settings.admission.on_too_long == "trim" else ("refuse",))
    policy = FitPolicy(
        remedies=tuple(remedies), keep_newest_turns=base.keep_newest_turns, summary_model=base.summary_model,
        summary_backend=base.summary_backend, summary_instructions=base.summary_instructions,
        summary_max_tokens=base.summary_max_tokens, summary_timeout_s=base.summary_timeout_s, strict=base.strict,
        notice=base.notice,
    )
    if model:
        name = find_model(model, settings.models.keys())
        if name is not None:
            policy = _apply(policy, settings.models[name].fitting)
    if tenant and tenant in settings.tenants:
        policy = _apply(policy, settings.tenants[tenant].fitting)
    return policy


POLICY_CACHE = 256
"""How many (tenant, model) policies ``FitPolicies`` keeps per configuration (model names come from clients)."""


class FitPolicies:
    """``policy_for``, worked out once per configuration, tenant and model (it runs on every request; with
    ``[models]`` or tenant overrides each call dumps the override settings): a new settings snapshot (a reload)
    starts afresh, and at most ``POLICY_CACHE`` are kept."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._found: dict[tuple[str | None, str | None], FitPolicy] = {}

    def get(self, settings: Settings, *, tenant: str | None = None, model: str | None = None) -> FitPolicy:
        if settings is not self._settings:
            self._settings, self._found = settings, {}
        key = (tenant, model)
        found = self._found.get(key)
        if found is None:
            if len(self._found) >= POLICY_CACHE:
                self._found.clear()
            found = self._found[key] = policy_for(settings, tenant=tenant, model=model)
        return found
