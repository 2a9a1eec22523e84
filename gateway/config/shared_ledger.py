"""The shared ledger (``[shared_ledger]``): several kvgate replicas keep their reservations, queues' capacity and
tenants' counters in one Redis (gateway/admission/shared). Without ``redis_url`` kvgate keeps them in process."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.config.base import Strict


class SharedLedgerSettings(Strict):
    """Reservations as leases in Redis, renewed by the replica that holds them; see gateway/admission/shared."""

    redis_url: SecretStr | None = Field(
        default=None, description="redis://[:password@]host:port/db; unset: the ledger lives in this process only",
    )
    prefix: str = Field(
        default="kvgate", min_length=1, max_length=64, description="key prefix: replicas sharing it share pools",
    )
    lease_ttl_s: float = Field(
        default=10.0, ge=0.2, le=600.0, description="a reservation whose replica stops renewing it (crashed, cut "
        "off) expires this long after its last renewal; renewed every third of it",
    )
    fence_margin_s: float = Field(
        default=1.0, gt=0, le=60.0, description="a replica that can't renew its leases ends their requests (a stream "
        "gets an error event, a reply not begun a 503) this long before they may expire, so no other replica admits "
        "into their room while they still run; below lease_ttl_s",
    )
    poll_s: float = Field(
        default=0.1, gt=0, le=5.0, description="while requests wait, how often the pool's totals across replicas are "
        "read again; a release on any replica wakes them at once too (Redis publishes it)",
    )
    timeout_s: float = Field(default=1.0, gt=0, le=30.0, description="one Redis call, connection included")
    connections: int = Field(
        default=32, ge=1, le=1024, description="Redis connections this replica keeps at most; a call while all are "
        "busy waits for one (within timeout_s) rather than failing",
    )
    on_unreachable: Literal["refuse", "local_share"] = Field(
        default="refuse", description="Redis unreachable: 'refuse' new work (503 with Retry-After), or "
        "'local_share': each replica admits into its share of every pool (1 / replicas) until Redis is back",
    )
    replicas: int = Field(
        default=1, ge=1, le=1024, description="how many replicas share the pools (for on_unreachable = local_share)",
    )

    @model_validator(mode="after")
    def _margin_below_ttl(self) -> SharedLedgerSettings:
        if self.fence_margin_s >= self.lease_ttl_s:
            raise ValueError(f"fence_margin_s ({self.fence_margin_s:g}) must be below lease_ttl_s "
                             f"({self.lease_ttl_s:g}): requests are ended that long before their leases may expire")
        return self

    @field_validator("redis_url")
    @classmethod
    def _url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value
