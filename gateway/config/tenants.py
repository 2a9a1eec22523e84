"""Tenants' settings (``[tenants.NAME]``): their API keys (plain or sha256), caps, rates, priority and weight."""

from __future__ import annotations

import hashlib
import re

from pydantic import Field, SecretStr, field_validator

from gateway.config.base import Strict, usable_key
from gateway.config.fitting import FittingOverrideSettings

_SHA256_HEX = re.compile(r"[0-9A-Fa-f]{64}")
ANONYMOUS_TENANT = "anonymous"
"""``[tenants.anonymous]``: the policy of requests without a key (and, if it allows them, with an unknown one)."""


class TenantSettings(Strict):
    """A team or a client: its API keys and its caps. Requests carry a key as ``Authorization: Bearer`` or
    ``X-Api-Key``. ``[tenants.anonymous]`` (no keys) is the policy of requests without a key."""

    api_keys: tuple[SecretStr, ...] = ()
    api_key_sha256: tuple[SecretStr, ...] = Field(
        default=(), description="keys stored hashed: each key's sha256 as 64 hex digits (printf %s KEY | sha256sum)",
    )
    max_active: int | None = Field(default=None, ge=1, description="sequences at once, per model")
    max_pool_share: int | float | None = Field(
        default=None, description="tokens its sequences may hold at once in each model's KV pool, on top of "
        "max_active: a fraction of the pool (a float in (0, 1], e.g. 0.25) or a number of tokens (an integer >= 1); "
        "more waits, and one request that alone needs more is refused (400)",
    )
    max_queued: int | None = Field(
        default=None, ge=0, description="places it may hold in each pool's queue (default: admission.max_queue_share "
        "of max_queue); more: 503 queue_full",
    )
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(
        default=None, ge=1, description="prompt + output tokens per minute, taken up front (prompt + the output "
        "the request may generate), the unused output given back when its usage (or, for a cut stream, its chunks) "
        "is known; over it: 429 with Retry-After",
    )
    requests_per_minute: int | None = Field(default=None, ge=1, description="over it: 429 with Retry-After")
    priority: int = Field(default=0, description="higher is served first from the queue")
    weight: float = Field(
        default=1.0, gt=0, le=1000, description="within one priority, the queue serves tenants' reserved tokens in "
        "proportion to their weights (admission.queue_order = \"fair\"): 2 gets twice the tokens of 1 when both wait",
    )
    allow_unknown_keys: bool = Field(
        default=False, description="[tenants.anonymous] only: a key no tenant has runs as anonymous instead of a 401",
    )
    fitting: FittingOverrideSettings = FittingOverrideSettings()

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for index, key in enumerate(value):
            try:
                usable_key(key)
            except ValueError as exc:
                raise ValueError(f"key {index + 1} of {len(value)} {exc}") from None
        return value

    @field_validator("max_pool_share", mode="before")
    @classmethod
    def _pool_share(cls, value: object) -> object:
        fraction = isinstance(value, float) and 0.0 < value <= 1.0
        tokens = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if value is not None and not (fraction or tokens):
            raise ValueError(f"is {value!r}; give a fraction of the pool in (0, 1] such as 0.25, or a number of "
                             "tokens (an integer, at least 1)")
        return value

    @field_validator("api_key_sha256")
    @classmethod
    def _digests(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for index, digest in enumerate(value):
            if not _SHA256_HEX.fullmatch(digest.get_secret_value()):
                raise ValueError(f"digest {index + 1} of {len(value)} is not 64 hex digits; store a key's sha256, "
                                 "made with: printf %s \"$KEY\" | sha256sum (the digits before the '-')")
        return tuple(SecretStr(digest.get_secret_value().lower()) for digest in value)

    def digests(self) -> list[str]:
        """Every key of this tenant as a lowercase sha256 hex digest: its plain keys hashed, then its stored ones."""
        return [sha256_hex(key.get_secret_value()) for key in self.api_keys] + [
            digest.get_secret_value() for digest in self.api_key_sha256
        ]


def sha256_hex(key: str) -> str:
    """The digest ``api_key_sha256`` stores for a key: sha256 of its UTF-8 bytes, lowercase hex."""
    return hashlib.sha256(key.encode()).hexdigest()
