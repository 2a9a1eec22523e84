"""Routing settings (``[routing]``): which backend a request goes to when several serve its model, and what happens
to a backend that fails (gateway/routing/)."""

from __future__ import annotations

from pydantic import Field

from gateway.config.base import Strict


class RoutingSettings(Strict):
    """Routing between backends that serve the same model, by expected time to first token (gateway/routing/)."""

    sticky: bool = Field(
        default=True, description="a conversation goes back to the backend that served it (its prompt cache) while "
        "that one is not much slower (sticky_slack_s)",
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
    default_service_s: float = Field(
        default=5.0, gt=0, description="seconds one request is taken to hold its slot until a pool has served some "
        "(then the median of its last 32, admitted to released)",
    )
    default_load_s: float = Field(
        default=5.0, gt=0, description="seconds an Ollama model is taken to load on a backend until a load was seen "
        "(then the median of the backend's own load_duration)",
    )
    sticky_slack_s: float = Field(
        default=1.0, ge=0, description="a conversation stays on its backend while its expected first token there is "
        "at most this much later than on the best one",
    )
