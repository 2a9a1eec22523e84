"""The admission policy's settings (``[admission]``): what kvgate reserves, rewrites, queues and refuses."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config.base import Strict


class ElasticSettings(Strict):
    """Elastic reservations (``[admission.elastic]``) on unified pools: a streamed reply reserves its prompt plus the
    output its model usually gives, and its reservation grows as it streams (gateway/admission/elastic.py)."""

    enabled: bool = Field(
        default=True, description="off: every request reserves its prompt plus its whole output limit, as before; "
        "a reply is then never ended by kvgate, and requests wait instead",
    )
    quantile: float = Field(default=0.95, gt=0, le=1, description="the share of observed answers the first "
                            "reservation covers whole (0.95: 19 in 20 never need to grow)")
    floor_tokens: int = Field(default=128, ge=16, description="the least output a first reservation holds")
    min_samples: int = Field(default=20, ge=1, description="answers observed on a model (or a tenant of it) "
                             "before its distribution is used; before that, the whole limit is reserved")
    window: int = Field(default=512, ge=1, description="the latest answers per model and tenant the "
                        "distribution keeps")
    step_tokens: int = Field(default=64, ge=8, description="how much a reservation grows at a time, once a "
                             "reply comes within half of it of its end")
    not_streamed: bool = Field(
        default=False, description="replies that are not streamed are elastic too, on llama-server (followed through "
        "its /slots); one kvgate must end gets a 503 reply_ended_by_kvgate, as it can't be ended with a final event",
    )
    admit_watermark: float = Field(
        default=0.90, gt=0, le=1, description="elastic requests are admitted while the pool's reservations stay "
        "below this share of its cells; the rest is kept for growth",
    )


class AdmissionSettings(Strict):
    """What kvgate does before forwarding (gateway/admission): reserve KV, pin num_ctx, clamp, queue or refuse."""

    enabled: bool = True
    default_output_tokens: int = Field(default=1024, ge=1, description="reserved when a client sets no limit")
    elastic: ElasticSettings = Field(default_factory=ElasticSettings)
    estimate_margin: float = Field(default=0.10, ge=0, le=1, description="extra share reserved for estimated counts")
    pin_num_ctx: bool = True
    clamp_output: bool = True
    on_too_long: Literal["trim", "reject"] = Field(
        default="trim", description="a chat too long for the context: drop its oldest history, or refuse it"
    )
    max_queue: int = Field(default=256, ge=0)
    max_queue_share: float = Field(
        default=0.5, gt=0, le=1, description="the share of a pool's max_queue places one tenant may hold (its own "
        "tenants.NAME.max_queued replaces it); more: 503 queue_full naming the tenant. Keyless requests are one tenant",
    )
    queue_timeout_s: float = Field(default=120.0, gt=0)
    per_tenant_max_active: int | None = Field(default=None, ge=1)
    overtake_window_s: float = Field(default=5.0, ge=0)
    queue_order: Literal["fair", "arrival"] = Field(
        default="fair", description="within one priority: 'fair' shares reserved tokens between tenants by their "
        "weight (one tenant's flood does not hold the others back); 'arrival' is first come, first served",
    )
    pool_refresh_s: float = Field(default=5.0, gt=0, description="how long a backend's slot layout is reused")
    probe_wait_s: float = Field(
        default=10.0, gt=0, description="how long requests wait for a backend's KV layout before a 503; a backend "
        "that refuses connections and answered nothing this long is down: 502 at once (one that did is waited for)"
    )
    default_context_tokens: int = Field(default=4096, ge=256, description="Ollama context when nothing says")
    max_auto_context_tokens: int = Field(
        default=32768, ge=256, description="Ollama: the largest context kvgate picks itself from free VRAM"
    )
