"""Deciding a load (``server/sched.go`` ``load``), as a pure function of the request and the free memory.

    plan_load(...) -> LoadPlan     what to allocate and where (the caller then tries to allocate it)
                   -> None         Ollama would evict a runner first (its prediction says it does not fit)

E3 predicts with ``PredictServerVRAM`` + the batch surcharge and, when other models are resident, evicts if that
exceeds 80% of the free memory; E2 evicts when its own estimate exceeds the free memory. The first model is never
pre-checked. The prediction also decides the placement (one GPU if it fits in 80% of one, else all of them).

E3's first model (nothing else loaded) then goes through llama.cpp's automatic fit (``fit_to_free``): when the
load does not fit the free memory minus 1 GiB per device, only the trailing layers that fit stay on the GPU and the
rest (weights and KV) run from system RAM; ``LoadPlan.offload`` says how. With other models resident the simulator
keeps the pre-check's eviction and the OOM retry (evict all, retry) instead: the load then fits or is retried as
the first model (ollama.md 4.2 items 5, 6, 8). E2, dynamic-KV mode and ``SimConfig.llama_fit = False`` never
offload.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.catalog import ModelSpec
from kvsim.config import SimConfig
from kvsim.gpu.load_cost import (
    LoadCost,
    Offload,
    auto_batch_e3,
    batch_surcharge,
    fit_to_free,
    load_cost,
    place,
    predicted_vram_e2,
    predicted_vram_e3,
)
from kvsim.ollama.options import Options, effective_context


@dataclass(frozen=True)
class LoadPlan:
    num_ctx: int  # per sequence, clamped to the trained context
    num_parallel: int
    num_batch: int
    predicted_bytes: int
    cost: LoadCost
    placement: dict[int, int]  # bytes per device
    offload: Offload | None = None  # None: every layer on the GPU


def plan_load(
    config: SimConfig, spec: ModelSpec, opts: Options, free_by_device: dict[int, int], *, others_loaded: bool
) -> LoadPlan | None:
    num_parallel = 1 if spec.is_embedding else config.num_parallel
    num_ctx = effective_context(opts.runner.num_ctx, spec.n_ctx_train)
    ctx_total = num_ctx * num_parallel
    free_total = max(sum(free_by_device.values()), 0)
    num_batch = opts.runner.num_batch
    if config.era == "e3":
        predicted = predicted_vram_e3(spec, ctx_total_tokens=ctx_total)
        if opts.num_batch_auto:
            num_batch = auto_batch_e3(ctx_total, predicted, free_total)
        with_surcharge = predicted + (0 if spec.is_embedding else batch_surcharge(num_batch))
        if others_loaded and with_surcharge > free_total * 80 // 100:
            return None
    else:
        predicted = predicted_vram_e2(
            spec, num_ctx=num_ctx, num_parallel=num_parallel, num_batch=num_batch, cache_type=config.cache_type
        )
        if others_loaded and predicted > free_total:
            return None
    cost = load_cost(
        spec,
        num_ctx=num_ctx,
        num_parallel=num_parallel,
        num_batch=num_batch,
        cache_type=config.cache_type,
        dynamic_kv=config.dynamic_kv,
    )
    placement = place(cost.total_bytes, predicted, free_by_device)
    offload = None
    if config.era == "e3" and config.llama_fit and not config.dynamic_kv and not others_loaded:
        used = {d: max(free_by_device[d], 0) for d in placement}
        cost, offload = fit_to_free(
            spec,
            cost,
            num_ctx=num_ctx,
            num_parallel=num_parallel,
            cache_type=config.cache_type,
            free_bytes=sum(used.values()),
            devices=len(used),
        )
        if offload is not None:
            placement = place(cost.total_bytes, predicted, used)  # the same devices, the smaller GPU part
    return LoadPlan(num_ctx, num_parallel, num_batch, predicted, cost, placement, offload)
