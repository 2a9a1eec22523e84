"""The shared ledger (``[shared_ledger]``): several kvgate replicas keep their reservations, queues' capacity and
tenants' counters in one Redis (gateway/admission/shared). Without ``redis_url`` kvgate keeps them in process."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from gateway.config_base import _Strict


class SharedLedgerConfig(_Strict):
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
    poll_s: float = Field(
        default=0.1, gt=0, le=5.0, description="while requests wait, how often the pool's totals across replicas are "
        "read again; a release on any replica wakes them at once too (Redis publishes it)",
    )
    timeout_s: float = Field(default=1.0, gt=0, le=30.0, description="one Redis call, connection included")
    on_unreachable: Literal["refuse", "local_share"] = Field(
        default="refuse", description="Redis unreachable: 'refuse' new work (503 with Retry-After), or "
        "'local_share': each replica admits into its share of every pool (1 / replicas) until Redis is back",
    )
    replicas: int = Field(
        default=1, ge=1, le=1024, description="how many replicas share the pools (for on_unreachable = local_share)",
    )

    @field_validator("redis_url")
    @classmethod
    def _url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value
