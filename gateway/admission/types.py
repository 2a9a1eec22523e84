"""Frozen data of sequence-level admission: the pool, the request's cost, the policy, and the decisions.

Everything here is plain data validated once, at construction; the planner reads it, the ledger and the waiting
room carry it. Nothing here imports asyncio or aiohttp.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, NamedTuple

from gateway.domain import BackendKind, Rewrites


class PoolKey(NamedTuple):
    """Which KV pool a request lands in: one loaded model on one backend."""

    backend: str
    model: str


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """The KV pool of one loaded model, in tokens.

    split   (Ollama: num_ctx x OLLAMA_NUM_PARALLEL; llama-server ``-np N`` without ``-kvu``):
            ``slots`` private slots of ``slot_ctx_tokens`` cells; a sequence only has to fit its own slot.
    unified (llama-server's default when ``-np`` is omitted): one pool of ``pool_tokens`` cells; every slot may grow
            to ``slot_ctx_tokens``, but the SUM of active sequences must fit, or every active request fails at once.
    """

    backend: str
    model: str
    backend_kind: BackendKind
    slot_ctx_tokens: int
    slots: int
    unified: bool
    pool_tokens: int

    def __post_init__(self) -> None:
        if not isinstance(self.backend_kind, BackendKind):
            kinds = sorted(kind.value for kind in BackendKind)
            raise ValueError(f"backend_kind is {self.backend_kind!r}; expected a BackendKind, one of {kinds}")
        if self.slot_ctx_tokens < 1 or self.slots < 1:
            raise ValueError(f"slot_ctx_tokens ({self.slot_ctx_tokens}) and slots ({self.slots}) must be at least 1")
        if self.pool_tokens < self.slot_ctx_tokens:
            raise ValueError(
                f"pool_tokens ({self.pool_tokens}) is smaller than slot_ctx_tokens ({self.slot_ctx_tokens}); "
                "a sequence could never fit"
            )

    @classmethod
    def split_pool(
        cls, backend: str, model: str, backend_kind: BackendKind, *, slot_ctx_tokens: int, slots: int
    ) -> PoolSpec:
        """Private slots: the pool is exactly ``slot_ctx_tokens * slots``."""
        return cls(backend, model, backend_kind, slot_ctx_tokens, slots, False, slot_ctx_tokens * slots)

    @classmethod
    def unified_pool(
        cls, backend: str, model: str, *, pool_tokens: int, slots: int, slot_ctx_tokens: int | None = None,
        backend_kind: BackendKind = BackendKind.LLAMA_SERVER,
    ) -> PoolSpec:
        """A unified pool (llama-server's); a slot may grow to the whole pool unless ``--kv-unified-per-slot``
        caps it."""
        slot_ctx = pool_tokens if slot_ctx_tokens is None else slot_ctx_tokens
        return cls(backend, model, backend_kind, slot_ctx, slots, True, pool_tokens)

    @property
    def key(self) -> PoolKey:
        return PoolKey(self.backend, self.model)


@dataclass(frozen=True, slots=True)
class RequestCost:
    """What one request will hold: its prompt (counted or estimated) and the output it may generate.

    ``max_output_tokens`` is the client's limit (``max_tokens``, ``num_predict``), None when it gave none;
    ``requested_num_ctx`` is Ollama's ``options.num_ctx`` when the client sent one. A higher ``priority`` is served
    first by the waiting room. ``sequences`` is how many completions the backend runs for each prompt (OpenAI ``n``,
    where the backend honours it: ``sequence_rules``), each holding the prompt and its output. ``weight`` is the
    tenant's share in the fair order of the queue (within one priority, tenants are served reserved tokens in
    proportion to their weights; ``fair_share``).

    ``batch_prompt_tokens`` is each prompt's length for a request the backend runs as one task per prompt (a
    multi-prompt batch, an embedding's inputs, a rerank's documents); ``prompt_tokens`` is then their sum. Empty for
    a request of one prompt (``prompts`` is then ``(prompt_tokens,)``).
    """

    prompt_tokens: int
    prompt_exact: bool
    max_output_tokens: int | None
    requested_num_ctx: int | None
    tenant: str = "default"
    priority: int = 0
    sequences: int = 1
    weight: float = 1.0
    model: str = ""
    """The model the client asked for: what messages name when the pool serves any name (an OpenAI-compatible
    server's one pool is keyed "")."""
    batch_prompt_tokens: tuple[int, ...] = ()
    expected_output_tokens: int | None = None
    """The output the model usually gives (``output_lengths``: a high quantile of its recent answers) when the
    reply's growth can be followed (a stream of one sequence): the planner then reserves the prompt plus this on a
    unified pool, not the whole limit, and the reservation grows as the reply streams (``elastic``). None: the
    whole limit."""

    @property
    def prompts(self) -> tuple[int, ...]:
        """Every prompt's length: the batch's, or the one prompt's."""
        return self.batch_prompt_tokens or (self.prompt_tokens,)

    def __post_init__(self) -> None:
        if any(tokens < 0 for tokens in self.batch_prompt_tokens):
            raise ValueError(f"batch_prompt_tokens is {self.batch_prompt_tokens}; no prompt can be negative")
        if self.batch_prompt_tokens and sum(self.batch_prompt_tokens) != self.prompt_tokens:
            raise ValueError(f"prompt_tokens is {self.prompt_tokens}, but the batch's prompts add up to "
                             f"{sum(self.batch_prompt_tokens)}")
        if not self.weight > 0:  # also refuses NaN
            raise ValueError(f"weight is {self.weight}; it must be positive")
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens is {self.prompt_tokens}; it can't be negative")
        if self.max_output_tokens is not None and self.max_output_tokens < 0:
            raise ValueError(f"max_output_tokens is {self.max_output_tokens}; use None for 'no limit given'")
        if self.requested_num_ctx is not None and self.requested_num_ctx < 1:
            raise ValueError(f"requested_num_ctx is {self.requested_num_ctx}; use None for 'not given'")
        if self.sequences < 1:
            raise ValueError(f"sequences is {self.sequences}; a request runs at least one")


@dataclass(frozen=True, slots=True)
class Policy:
    """Operator choices for one pool or tenant; built once from configuration.

    - ``estimate_margin``: extra fraction of the prompt reserved when its count is an estimate.
    - ``pin_num_ctx``: on Ollama, rewrite ``options.num_ctx`` to the loaded slot context, so a client asking for
      another value never reloads the model (ollama.md section 4.5).
    - ``clamp_output``: lower the client's max output so prompt + output fit the slot, instead of refusing.
    - ``per_tenant_max_active``: active sequences one tenant may hold in one pool; more wait.
    - ``per_tenant_max_share``: the share of each pool's tokens one tenant's reservations may hold at once: a float in
      (0, 1] is a fraction of ``PoolSpec.pool_tokens``, an int >= 1 a number of tokens. The planner turns it into
      tokens per pool (``planner.tenant_share_tokens``); a request that would take the tenant over it waits, one
      that alone exceeds it is refused.
    - ``overtake_window_s``: while the head of a queue has waited less than this, smaller requests behind it that fit
      may go first; after it, nobody passes the head until it fits (no starvation of big requests).
    - ``queue_timeout_s``: how long a request may wait; a request's own deadline (``X-Kvgate-Deadline``, the OpenAI
      SDK's ``X-Stainless-Read-Timeout``) can shorten it, never lengthen it (``queue_limit_name`` then says so).
    - ``fair_queueing``: within one priority, order the queue by weighted fair share of reserved tokens between
      tenants (``fair_share``); off, by arrival.
    - ``max_queue_share`` and ``tenant_max_queued``: the places of a pool's queue one tenant may hold: its own
      ``max_queued`` when set, else ``max_queue_share`` of ``max_queue`` (``queue_share``); more is 503 ``queue_full``.
    - ``estimate_is_final``: the prompt's count is an estimate no counter can better (the real count was asked for
      and is unavailable): the planner then never refuses it for its length; the backend's own count decides
      (planner rule 2).
    """

    default_output_tokens: int = 1024
    estimate_margin: float = 0.10
    pin_num_ctx: bool = True
    clamp_output: bool = True
    max_queue: int = 256
    queue_timeout_s: float = 120.0
    per_tenant_max_active: int | None = None
    per_tenant_max_share: float | int | None = None
    overtake_window_s: float = 5.0
    queue_limit_name: str = "queue_timeout_s"
    fair_queueing: bool = True
    """What set ``queue_timeout_s``, for the refusal: the setting, or the request's own deadline."""
    estimate_is_final: bool = False
    max_queue_share: float = 0.5
    tenant_max_queued: int | None = None
    elastic_watermark: float | None = None
    """Elastic reservations on (``admission.elastic``): a request reserving less than its limit is admitted while the
    unified pool's reservations, its own included, stay within this share of the pool; the rest is kept for the
    growth of those already running. None: off (every request reserves its whole limit)."""
    elastic_floor_tokens: int = 128
    """The least output an elastic reservation holds."""

    def __post_init__(self) -> None:
        if self.elastic_watermark is not None and not 0.0 < self.elastic_watermark <= 1.0:
            raise ValueError(f"elastic_watermark is {self.elastic_watermark}; expected a fraction in (0, 1] or None")
        if self.default_output_tokens < 0 or self.max_queue < 0:
            raise ValueError("default_output_tokens and max_queue can't be negative")
        if not 0.0 <= self.estimate_margin <= 10.0:
            raise ValueError(f"estimate_margin is {self.estimate_margin}; expected a fraction such as 0.10")
        if self.queue_timeout_s <= 0 or self.overtake_window_s < 0:
            raise ValueError("queue_timeout_s must be positive and overtake_window_s not negative")
        if not 0.0 < self.max_queue_share <= 1.0 or (self.tenant_max_queued or 0) < 0:
            raise ValueError(f"max_queue_share is {self.max_queue_share}; expected a fraction in (0, 1]")
        if self.per_tenant_max_active is not None and self.per_tenant_max_active < 1:
            raise ValueError(f"per_tenant_max_active is {self.per_tenant_max_active}; use None for no cap")
        share = self.per_tenant_max_share
        if share is not None and not valid_pool_share(share):
            raise ValueError(f"per_tenant_max_share is {share!r}; expected a fraction in (0, 1] such as 0.25, a number "
                             "of tokens (an integer, at least 1), or None for no cap")


def valid_pool_share(share: object) -> bool:
    """A pool share is a float fraction in (0, 1] or an int number of tokens >= 1 (a bool is neither)."""
    if isinstance(share, bool):
        return False
    if isinstance(share, int):
        return share >= 1
    return isinstance(share, float) and 0.0 < share <= 1.0


def _frozen_counts(counts: Mapping[str, int] | None = None) -> Mapping[str, int]:
    return MappingProxyType(dict(counts or {}))


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """What one pool holds right now: the only live state the planner sees. ``per_tenant_tokens`` is the tokens each
    tenant's live reservations hold (the tenant's share), beside its active sequences."""

    active_sequences: int = 0
    reserved_tokens: int = 0
    per_tenant_active: Mapping[str, int] = field(default_factory=_frozen_counts)
    per_tenant_tokens: Mapping[str, int] = field(default_factory=_frozen_counts)

    def __post_init__(self) -> None:
        if not isinstance(self.per_tenant_active, MappingProxyType):
            object.__setattr__(self, "per_tenant_active", _frozen_counts(self.per_tenant_active))
        if not isinstance(self.per_tenant_tokens, MappingProxyType):
            object.__setattr__(self, "per_tenant_tokens", _frozen_counts(self.per_tenant_tokens))


# --- decisions: a closed union, ``Decision = Admit | Wait | Reject`` ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """Forward now, holding ``reserve_tokens`` of the pool for ``sequences`` sequences; apply ``rewrites``; ``notes``
    say why, for operators."""

    reserve_tokens: int
    rewrites: Rewrites = field(default_factory=Rewrites)
    notes: tuple[str, ...] = ()
    sequences: int = 1
    limit_tokens: int | None = None
    """An elastic reservation (``RequestCost.expected_output_tokens``): the most it may grow to, the prompt plus the
    whole output limit, what a fixed reservation holds from the start. None: ``reserve_tokens`` is already that."""


WaitScope = Literal["pool", "tenant"]


@dataclass(frozen=True, slots=True)
class Wait:
    """Not now: the pool (``scope="pool"``) or the tenant's cap (``scope="tenant"``) is full; ask again later."""

    reason: str
    scope: WaitScope = "pool"


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse with an HTTP status, a stable code and a message naming the limit, the value and what to do."""

    status: int
    code: str
    message: str


Decision = Admit | Wait | Reject
