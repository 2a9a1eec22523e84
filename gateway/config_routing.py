"""Routing settings (``[routing]``): which backend a request goes to when several serve its model, and what happens
to a backend that fails (gateway/routing/)."""

from __future__ import annotations

from pydantic import Field

from gateway.config_base import _Strict


class RoutingConfig(_Strict):
    """Routing by memory between backends that serve the same model (gateway/routing/rank.py)."""

    sticky: bool = Field(
        default=True, description="a conversation goes back to the backend that served it (its prompt cache) while "
        "that one has room",
    )
    sticky_entries: int = Field(default=10_000, ge=1, description="conversations remembered (least recent go first)")
    sticky_ttl_s: float = Field(default=600.0, gt=0, description="a conversation idle this long is forgotten")
    down_s: float = Field(
        default=10.0, gt=0, description="a backend that refuses, drops or times out a request is out this long; "
        "doubled while it keeps failing",
    )
    max_down_s: float = Field(default=120.0, gt=0, description="the longest a failing backend stays out")
    retries: int = Field(
        default=2, ge=0, description="other backends a request is retried on when its backend failed before "
        "anything reached the client",
    )
    probe_wait_s: float = Field(
        default=0.5, gt=0, description="how long routing waits for the pool of a backend not probed yet",
    )
