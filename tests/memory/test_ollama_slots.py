"""The sequences Ollama runs a model with, inferred from /api/ps sizes (gateway/memory/ollama_slots.py).

The sizes come from the simulator's own memory model (kvsim.ollama.load_plan: weights, KV, compute buffers, the
batch Ollama picks, llama.cpp's fit), written from the fact sheets and not from the gateway's, for every catalog
model at 1, 2 and 4 sequences and six contexts; the profile is what a client reads from the simulator's /api/show.
The tables are printed (pytest -s): ``n`` is exact, ``n<`` fewer than the server runs (a short context: kvgate
under-uses the server), ``n!`` more (never allowed).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.memory.kv import CacheType
from gateway.memory.ollama_slots import MAX_SLOTS, SlotInference, infer_ollama_slots
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.ollama_answers import LoadedModel, profile_from_show
from kvsim.catalog import CATALOG, ModelSpec, model_info
from kvsim.config import SimConfig
from kvsim.gpu.vgpu import GIB
from kvsim.modelspec import tensor_list
from kvsim.ollama.load_plan import plan_load
from kvsim.ollama.options import Options, RunnerOptions

CONTEXTS = (2048, 4096, 8192, 16384, 32768, 131072)
PARALLEL = (1, 2, 4)


def profile(spec: ModelSpec, *, tensors: bool = True) -> ModelProfile:
    show: dict[str, Any] = {"model_info": model_info(spec), "capabilities": list(spec.capabilities), "details": {}}
    if tensors:
        show["tensors"] = tensor_list(spec)
    return profile_from_show(spec.name, show, size_bytes=spec.file_bytes)


def simulated_ps(spec: ModelSpec, num_ctx: int, parallel: int, *, gpu_gib: int = 200,
                 cache: str = "f16") -> tuple[LoadedModel, int]:
    """The /api/ps entry the simulator shows after loading ``spec`` (nothing else loaded), and its parallel."""
    config = SimConfig(num_parallel=parallel, gpu_bytes=(gpu_gib * GIB,), kv_cache_type=cache)
    opts = Options(runner=RunnerOptions(num_ctx=num_ctx), num_ctx_auto=False, num_batch_auto=True)
    plan = plan_load(config, spec, opts, {0: gpu_gib * GIB}, others_loaded=False)
    assert plan is not None
    host = plan.offload.host_bytes if plan.offload is not None else 0
    entry = LoadedModel(spec.name, spec.digest, plan.cost.total_bytes + host, plan.cost.total_bytes, plan.num_ctx,
                        None, None)
    return entry, plan.num_parallel


def _cell(inferred: SlotInference, actual: int) -> str:
    return f"{inferred.slots}" + ("" if inferred.slots == actual else "<" if inferred.slots < actual else "!")


def _table(title: str, *, tensors: bool = True, gpu_gib: int = 200, cache: str = "f16",
           configured_cache: CacheType = CacheType.F16) -> dict[tuple[str, int, int], tuple[int, int]]:
    """(model, context, parallel) -> (inferred, actual), printed as a table."""
    found = {}
    print(f"\n{title}\n{'model':<34}" + "".join(f"{ctx // 1024:>4}k x1,2,4" for ctx in CONTEXTS))
    for name, spec in CATALOG.items():
        prof = profile(spec, tensors=tensors)
        cells = []
        for ctx in CONTEXTS:
            row = []
            for parallel in PARALLEL:
                entry, actual = simulated_ps(spec, ctx, parallel, gpu_gib=gpu_gib, cache=cache)
                inferred = infer_ollama_slots(prof, entry, type_k=configured_cache, type_v=configured_cache)
                found[(name, ctx, parallel)] = (inferred.slots, actual)
                row.append(_cell(inferred, actual))
            cells.append(",".join(row))
        print(f"{name:<34}" + "".join(f"{cell:>12}" for cell in cells))
    return found


def test_every_catalog_model_at_every_context_on_a_large_gpu() -> None:
    found = _table("/api/ps size -> sequences: every layer on the GPU, the tensor list known (sim: 200 GiB)")
    assert all(inferred <= actual for inferred, actual in found.values())
    for (name, ctx, _), (inferred, actual) in found.items():
        if ctx >= 4096:  # from 4K tokens on one more sequence outweighs the compute buffers of every model
            assert inferred == actual, (name, ctx, inferred, actual)
    assert sum(inferred == actual for inferred, actual in found.values()) >= len(found) - 2


def test_partly_offloaded_models_count_their_host_buffers() -> None:
    """On a 12 GiB GPU llama.cpp's fit leaves layers (and their KV) in system RAM: /api/ps ``size`` counts them,
    with the token embeddings; the batch may step down too. Still never more than the server runs."""
    found = _table("the same on a 12 GiB GPU (partial offload)", gpu_gib=12)
    assert all(inferred <= actual for inferred, actual in found.values())
    for (name, ctx, _), (inferred, actual) in found.items():
        if ctx >= 32768:
            assert inferred == actual, (name, ctx, inferred, actual)


def test_without_a_tensor_list_the_span_is_wider_and_the_count_never_higher() -> None:
    found = _table("the tensor list not known (older Ollama): weights +- the embedding table", tensors=False)
    assert all(inferred <= actual for inferred, actual in found.values())
    for (name, ctx, _), (inferred, actual) in found.items():
        if ctx >= 16384:
            assert inferred == actual, (name, ctx, inferred, actual)


def test_a_quantized_cache_kvgate_was_not_told_of_counts_fewer_and_told_counts_right() -> None:
    untold = _table("OLLAMA_KV_CACHE_TYPE=q8_0, kvgate assumes f16", cache="q8_0")
    told = _table("OLLAMA_KV_CACHE_TYPE=q8_0, cache_type_k/v = q8_0", cache="q8_0", configured_cache=CacheType.Q8_0)
    assert all(inferred <= actual for inferred, actual in untold.values())
    assert all(inferred <= actual for inferred, actual in told.values())
    for key, (inferred, actual) in told.items():
        if key[1] >= 8192:
            assert inferred == actual, key


LLAMA = CATALOG["llama3.1:8b"]


def _entry(size: int, *, vram: int | None = None, ctx: int | None = 8192) -> LoadedModel:
    return LoadedModel("m", "", size, size if vram is None else vram, ctx, None, None)


def _sized(parallel: int, ctx: int = 8192) -> int:
    return simulated_ps(LLAMA, ctx, parallel)[0].size_bytes


UNIT_CASES: list[tuple[str, ModelProfile, LoadedModel, str | None, int, str]] = [
    ("two sequences", profile(LLAMA), _entry(_sized(2)), None, 2, "inferred from /api/ps size"),
    ("four sequences at 32K", profile(LLAMA), _entry(_sized(4, 32768), ctx=32768), None, 4, "inferred"),
    ("the file's size (log not parsed yet)", profile(LLAMA), _entry(LLAMA.file_bytes), None, 1,
     "assumed 1: /api/ps size"),
    ("no context_length (before v0.9.7)", profile(LLAMA), _entry(_sized(2), ctx=None), None, 1,
     "assumed 1: /api/ps gives no context_length"),
    ("Ollama before v0.30 reports estimates", profile(LLAMA), _entry(_sized(2)), "0.20.0", 1,
     "assumed 1: Ollama 0.20.0 reports its own estimates"),
    ("v0.30 and later allocate", profile(LLAMA), _entry(_sized(2)), "0.33.0-rc2", 2, "inferred"),
    ("an embedding model", profile(CATALOG["nomic-embed-text:latest"]), _entry(10 * GIB), None, 1,
     "embedding models"),
    ("an architecture Ollama runs alone", replace(profile(LLAMA), shape=replace(profile(LLAMA).shape,
                                                                                 architecture="qwen3next")),
     _entry(_sized(4)), None, 1, "Ollama runs qwen3next models with one sequence"),
    ("a separate projector is not one more sequence",
     replace(profile(CATALOG["gemma3:12b"]), has_projector=True),
     _entry(simulated_ps(CATALOG["gemma3:12b"], 32768, 2)[0].size_bytes + (1 << 30), ctx=32768), None, 2,
     "inferred"),
    ("a size beyond every count", profile(LLAMA), _entry(400 * GIB), None, MAX_SLOTS, "unexplained"),
    ("a context past the trained one is clamped", profile(CATALOG["phi3:mini"]),
     _entry(simulated_ps(CATALOG["phi3:mini"], 4096, 2)[0].size_bytes, ctx=65536), None, 2, "4,096 tokens"),
]


@pytest.mark.parametrize(("name", "prof", "entry", "version", "slots", "reason"), UNIT_CASES,
                         ids=[case[0] for case in UNIT_CASES])
def test_sizes_to_slots(name: str, prof: ModelProfile, entry: LoadedModel, version: str | None, slots: int,
                        reason: str) -> None:
    inferred = infer_ollama_slots(prof, entry, version=version)
    print(f"\n{name:<44} {entry.size_bytes / GIB:7.2f} GiB -> {inferred.slots} ({inferred.reason})")
    assert inferred.slots == slots
    assert reason in inferred.reason
    assert inferred.inferred is not inferred.reason.startswith("assumed")


def test_a_pool_probe_that_asks_again_reuses_the_layouts_it_computed() -> None:
    """Every pool probe (admission.pool_refresh_s, inside the wait of the request that finds the layout old) infers
    the slots of the same loaded model again: the 32 candidate layouts are computed once, the answer is the same."""
    from gateway.memory import ollama_slots

    ollama_slots._spans.cache_clear()
    prof, entry = profile(LLAMA), _entry(_sized(2))
    first = infer_ollama_slots(prof, entry)
    again = infer_ollama_slots(replace(prof), replace(entry))  # equal, not the same objects: a new probe's reading
    info = ollama_slots._spans.cache_info()
    print(f"{first.slots} slots twice; layouts computed {info.misses} time(s), reused {info.hits}")
    assert (again, first.slots) == (first, 2)
    assert (info.misses, info.hits) == (1, 1)
    other = infer_ollama_slots(prof, _entry(_sized(2, ctx=16384), ctx=16384))  # another context: its own layouts
    assert (other.slots, ollama_slots._spans.cache_info().misses) == (2, 2)
