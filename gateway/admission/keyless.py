"""The caps of keyless requests: what a request runs with when it carries no key kvgate reads (none, or one that is
not ``Authorization: Bearer`` / ``X-Api-Key``: ``Basic ...``, ``Token <key>``) while tenants have keys.

    no tenant has a key                 everyone is ``anonymous``: ``[tenants.anonymous]``'s caps, or none
    tenants have keys, and
      [tenants.anonymous] sets a cap    ``anonymous`` with exactly those caps (the operator's choice)
      it sets none (or is absent)       ``anonymous`` with the tightest of every tenant's caps, cap by cap: the
                                        smallest max_active, max_prompt_tokens, max_output_tokens, max_pool_share,
                                        max_queued, tokens and requests per minute any tenant has, the lowest
                                        priority and weight; a cap no tenant sets stays unset
    server.require_api_key = true       401

So a tenant's caps are never one header away from advisory: leaving a key out can only get a client less. The same
caps apply to an unknown key that ``[tenants.anonymous] allow_unknown_keys`` lets in. Pure (no I/O).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from gateway.admission.rates import RateLimit
from gateway.config.settings import ANONYMOUS_TENANT, Settings, TenantSettings

if TYPE_CHECKING:
    from gateway.admission.tenant_keys import Tenant

N = TypeVar("N", int, float)
CAP_FIELDS = ("max_active", "max_prompt_tokens", "max_output_tokens", "max_pool_share", "max_queued",
              "tokens_per_minute", "requests_per_minute")
_HOW = "(no key, or one not sent as 'Authorization: Bearer' or 'X-Api-Key')"


def sets_a_cap(config: TenantSettings | None) -> bool:
    return config is not None and any(getattr(config, name) is not None for name in CAP_FIELDS)


def _least(values: Iterable[N | None]) -> N | None:
    given = [value for value in values if value is not None]
    return min(given) if given else None


def _tightest_share(shares: Sequence[float | int | None]) -> float | int | None:
    """A fraction of the pool and a number of tokens can't be compared without a pool: fractions win when any
    tenant has one (the smallest), else the fewest tokens."""
    fractions = [share for share in shares if isinstance(share, float)]
    return min(fractions) if fractions else _least(shares)


def tightest(anonymous: Tenant, others: Sequence[TenantSettings]) -> Tenant:
    """``anonymous`` with the tightest of ``others``' caps, cap by cap (module docstring)."""
    if not others:
        return anonymous
    return replace(
        anonymous,
        max_active=_least(t.max_active for t in others),
        max_prompt_tokens=_least(t.max_prompt_tokens for t in others),
        max_output_tokens=_least(t.max_output_tokens for t in others),
        max_pool_share=_tightest_share([t.max_pool_share for t in others]),
        max_queued=_least(t.max_queued for t in others),
        rate=RateLimit(_least(t.tokens_per_minute for t in others), _least(t.requests_per_minute for t in others)),
        priority=min(t.priority for t in others),
        weight=min(t.weight for t in others),
    )


def keyless_tenant(settings: Settings, anonymous: Tenant, *, tenants_have_keys: bool) -> Tenant:
    """The tenant keyless requests run as (``anonymous``: ``[tenants.anonymous]`` as configured)."""
    if not tenants_have_keys or sets_a_cap(settings.tenants.get(ANONYMOUS_TENANT)):
        return anonymous
    return tightest(anonymous, [t for name, t in settings.tenants.items() if name != ANONYMOUS_TENANT])


def _caps(tenant: Tenant) -> str:
    fields = [(name, getattr(tenant, name)) for name in CAP_FIELDS[:5]]
    fields += [("tokens_per_minute", tenant.rate.tokens_per_minute),
               ("requests_per_minute", tenant.rate.requests_per_minute)]
    words = [f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}" for name, value in fields
             if value is not None]
    if tenant.priority:
        words.append(f"priority={tenant.priority}")
    if tenant.weight != 1.0:
        words.append(f"weight={tenant.weight:g}")
    return ", ".join(words)


def keyless_caps_line(settings: Settings) -> str:
    """One line for the start-up log: which caps keyless requests get (no key or secret in it)."""
    from gateway.admission.tenant_keys import TenantDirectory  # tenants.py builds its keyless tenant from this module

    if settings.server.require_api_key:
        return "keyless requests are refused (401): server.require_api_key = true"
    directory = TenantDirectory(settings)
    if not directory.enabled:
        caps = _caps(directory.anonymous)
        if not caps:
            return "keyless requests are uncapped: no tenant has an API key"
        return f"every request runs as tenant 'anonymous' (no tenant has an API key), with the caps of " \
               f"[tenants.anonymous]: {caps}"
    caps = _caps(directory.anonymous)
    if sets_a_cap(settings.tenants.get(ANONYMOUS_TENANT)):
        return f"keyless requests {_HOW} run as tenant 'anonymous' with the caps of [tenants.anonymous]: {caps}"
    if not caps:
        return f"keyless requests {_HOW} run as tenant 'anonymous' uncapped: neither [tenants.anonymous] nor any " \
               "tenant sets a cap"
    return f"keyless requests {_HOW} run as tenant 'anonymous' with the tightest of every tenant's caps " \
           f"([tenants.anonymous] sets none): {caps}"
