"""Who is asking: an API key maps to a tenant, whose caps admission applies.

Keys are compared in constant time against every configured key (so the time taken says nothing about which key,
or how much of one, matched) and never logged. Without ``server.require_api_key``, a request with no key (or an
unknown one) is the ``anonymous`` tenant, with no caps beyond the global policy.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config import Settings
from gateway.errors import Unauthorized

ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    max_active: int | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    priority: int = 0


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a client sent: ``Authorization: Bearer <key>`` or ``X-Api-Key: <key>``."""
    authorization = headers.get("Authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return headers.get("X-Api-Key") or None


class TenantDirectory:
    def __init__(self, settings: Settings) -> None:
        self._required = settings.server.require_api_key
        self._keys: list[tuple[bytes, Tenant]] = []
        for name, config in settings.tenants.items():
            tenant = Tenant(name, config.max_active, config.max_prompt_tokens, config.max_output_tokens,
                            config.priority)
            self._keys += [(key.get_secret_value().encode(), tenant) for key in config.api_keys]

    @property
    def enabled(self) -> bool:
        """Whether clients' keys are kvgate's (and so must not travel to the backend)."""
        return bool(self._keys)

    def identify(self, headers: Mapping[str, str]) -> Tenant:
        """The tenant whose key the request carries. A key with any byte outside printable ASCII (header bytes
        that are not UTF-8 arrive as lone surrogates) is no one's key: unknown, so 401 when keys are required."""
        given = presented_key(headers)
        found: Tenant | None = None
        if given is not None:
            candidate = given.encode() if _printable_ascii(given) else b""  # b"" matches no key
            for key, tenant in self._keys:  # no early exit: every key is compared
                if hmac.compare_digest(candidate, key) and candidate:
                    found = tenant
        if found is not None:
            return found
        if self._required:
            reason = "no API key was sent" if given is None else "the API key is not one of kvgate's"
            raise Unauthorized(f"{reason}; send a tenant's key as 'Authorization: Bearer <key>' or 'X-Api-Key'")
        return Tenant(ANONYMOUS)


def _printable_ascii(text: str) -> bool:
    return text.isascii() and text.isprintable()
