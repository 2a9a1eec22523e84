"""A KV pool named as what it is, for people (the status page, ``kvgate check``); pure.

    unified   "2,048 cells shared by 4 slots"                   one pool: the slots' sequences together must fit
              "16,384 cells shared by 4 slots, at most 4,096 per sequence"   (``--kv-unified-per-slot``)
    split     "2 slots x 8,192 tokens"                          each sequence has its own slot
    unknown   "4 slots of 2,048 tokens, layout unknown"

A unified pool's slots are no slots of its size: four slots of a 2,048-cell pool do not hold 4 x 2,048 tokens.
"""

from __future__ import annotations

from gateway.admission.types import PoolSpec


def _n(value: int) -> str:
    return f"{value:,}"


def _slots(count: int) -> str:
    return f"{count} slot" if count == 1 else f"{count} slots"


def layout_label(*, unified: bool | None, slots: int, slot_ctx_tokens: int, pool_tokens: int | None = None) -> str:
    """The layout in words; ``pool_tokens`` is a unified pool's size (its slot context when not given)."""
    if unified is None:
        return f"{_slots(slots)} of {_n(slot_ctx_tokens)} tokens, layout unknown"
    if not unified:
        return f"{_slots(slots)} x {_n(slot_ctx_tokens)} tokens"
    cells = pool_tokens if pool_tokens is not None else slot_ctx_tokens
    label = f"{_n(cells)} cells shared by {_slots(slots)}"
    return label if slot_ctx_tokens >= cells else f"{label}, at most {_n(slot_ctx_tokens)} per sequence"


def pool_label(pool: PoolSpec) -> str:
    return layout_label(unified=pool.unified, slots=pool.slots, slot_ctx_tokens=pool.slot_ctx_tokens,
                        pool_tokens=pool.pool_tokens)
