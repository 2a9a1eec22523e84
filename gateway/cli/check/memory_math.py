"""kvgate's own memory math (gateway.memory.kv), as ``kvgate check`` needs it for its fixes (pure)."""

from __future__ import annotations

from gateway.memory.kv import CacheType, ModelShape, ShapeError, ollama_kv_cache_bytes, parse_cache_type

FIT_SHARE = 0.95
"""A suggested context must leave 5% of the memory it may use free (allocator slack, the CUDA context)."""
MIN_CONTEXT_TOKENS = 1024


def cache_type(name: str | None) -> CacheType:
    try:
        return parse_cache_type(name or "f16")
    except ValueError:
        return CacheType.F16


def ollama_kv_bytes(shape: ModelShape, num_ctx: int, parallel: int, type_k: str | None, type_v: str | None) -> int:
    return ollama_kv_cache_bytes(shape, num_ctx=num_ctx, num_parallel=parallel, type_k=cache_type(type_k),
                                 type_v=cache_type(type_v))


def pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def largest_fitting_context(
    shape: ModelShape, *, parallel: int, fixed_bytes: int, budget_bytes: int, upper_tokens: int,
    type_k: str | None = None, type_v: str | None = None,
) -> int | None:
    """The largest power-of-two num_ctx (at least MIN_CONTEXT_TOKENS, below ``upper_tokens``) whose KV cache, with
    ``fixed_bytes`` (weights, compute buffers), fits FIT_SHARE of ``budget_bytes``; None when even the smallest
    does not."""
    best = None
    ctx = MIN_CONTEXT_TOKENS
    while ctx < upper_tokens:
        try:
            kv = ollama_kv_bytes(shape, ctx, parallel, type_k, type_v)
        except ShapeError:
            return best
        if fixed_bytes + kv > budget_bytes * FIT_SHARE:
            break
        best = ctx
        ctx *= 2
    return best
