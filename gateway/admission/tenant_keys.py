"""Who is asking: an API key maps to a tenant, whose caps admission applies.

Keys are kept as sha256 digests (``api_keys`` are hashed at start-up, ``api_key_sha256`` are stored that way): the
presented key is hashed once and its digest compared in constant time against every configured digest (no early
exit, and every digest has the same length, so the time taken says nothing about which key, or how much of one,
matched). Keys and digests are never logged.

Who a request runs as, once any tenant has a key (kvgate's keys; otherwise every request is ``anonymous``):

    known key     its tenant
    no key        ``anonymous``, with the caps of ``[tenants.anonymous]``, or when it sets none the tightest of every
                  tenant's (keyless.py); 401 with ``server.require_api_key``. A key not sent as ``Bearer`` or
                  ``X-Api-Key`` (``Basic``, ``Token``) is no key
    unknown key   401, unless ``[tenants.anonymous] allow_unknown_keys = true``: then ``anonymous``
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gateway.admission.keyless import keyless_tenant
from gateway.admission.rates import RateLimit
from gateway.admission.types import Policy
from gateway.config.settings import ANONYMOUS_TENANT, Settings, TenantSettings
from gateway.errors import Unauthorized

ANONYMOUS = ANONYMOUS_TENANT
ADMIN_TENANT = "kvgate-admin"
"""Requests carrying ``server.admin_key`` (the proxy's: the admin runs uncapped, its keep_alive honoured)."""
NO_RATE_LIMIT = RateLimit()
_HOW = "send a tenant's key as 'Authorization: Bearer <key>' or 'X-Api-Key'"


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    max_active: int | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    priority: int = 0
    max_pool_share: float | int | None = None
    rate: RateLimit = NO_RATE_LIMIT
    weight: float = 1.0
    max_queued: int | None = None


def tenant_policy(policy: Policy, tenant: Tenant) -> Policy:
    """``policy`` with the tenant's own caps in place of the defaults (``policy`` itself when it has none)."""
    if tenant.max_active is None and tenant.max_pool_share is None and tenant.max_queued is None:
        return policy
    return replace(
        policy,
        per_tenant_max_active=policy.per_tenant_max_active if tenant.max_active is None else tenant.max_active,
        per_tenant_max_share=policy.per_tenant_max_share if tenant.max_pool_share is None else tenant.max_pool_share,
        tenant_max_queued=policy.tenant_max_queued if tenant.max_queued is None else tenant.max_queued,
    )


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a client sent: ``Authorization: Bearer <key>`` or ``X-Api-Key: <key>``."""
    authorization = headers.get("Authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return headers.get("X-Api-Key") or None


def _tenant(name: str, config: TenantSettings | None) -> Tenant:
    if config is None:
        return Tenant(name)
    return Tenant(name, config.max_active, config.max_prompt_tokens, config.max_output_tokens, config.priority,
                  config.max_pool_share, RateLimit(config.tokens_per_minute, config.requests_per_minute), config.weight,
                  config.max_queued)


class TenantDirectory:
    def __init__(
        self, settings: Settings, *, compare_digest: Callable[[bytes, bytes], bool] = hmac.compare_digest
    ) -> None:
        """``compare_digest`` compares two digests in constant time (a test records the comparisons)."""
        self._compare_digest = compare_digest
        self._required = settings.server.require_api_key
        self._digests: list[tuple[bytes, Tenant]] = []
        for name, config in settings.tenants.items():
            tenant = _tenant(name, config)
            self._digests += [(bytes.fromhex(digest), tenant) for digest in config.digests()]
        anonymous = settings.tenants.get(ANONYMOUS)
        self._anonymous = keyless_tenant(settings, _tenant(ANONYMOUS, anonymous), tenants_have_keys=bool(self._digests))
        self._unknown_is_anonymous = not self._digests or (anonymous is not None and anonymous.allow_unknown_keys)

    def __repr__(self) -> str:
        return f"TenantDirectory(keys={len(self._digests)}, required={self._required})"

    @property
    def enabled(self) -> bool:
        """Whether clients' keys are kvgate's (and so must not travel to the backend)."""
        return bool(self._digests)

    @property
    def anonymous(self) -> Tenant:
        """The tenant of requests without a key: ``[tenants.anonymous]``'s caps, or the tightest (keyless.py)."""
        return self._anonymous

    def identify(self, headers: Mapping[str, str]) -> Tenant:
        """The tenant whose key the request carries (see the module's table). A key with any byte outside printable
        ASCII (header bytes that are not UTF-8 arrive as lone surrogates) is no one's key: unknown."""
        given = presented_key(headers)
        found: Tenant | None = None
        if given is not None and self._digests:
            usable = _printable_ascii(given)
            digest = hashlib.sha256(given.encode() if usable else b"").digest()
            for configured, tenant in self._digests:  # no early exit: every digest is compared
                if self._compare_digest(digest, configured) and usable:
                    found = tenant
        if found is not None:
            return found
        if given is None:
            if self._required:
                raise Unauthorized(f"no API key was sent; {_HOW}")
            return self._anonymous
        if self._required or not self._unknown_is_anonymous:
            alternative = "" if self._required else ", or none to run as the tenant 'anonymous'"
            raise Unauthorized(f"the API key is not one of kvgate's; {_HOW}{alternative}")
        return self._anonymous


def _printable_ascii(text: str) -> bool:
    return text.isascii() and text.isprintable()
