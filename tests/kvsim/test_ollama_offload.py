"""E3's partial offload: llama.cpp's automatic fit on the first model (ollama.md 4.2 items 5, 6, 8; llama-server.md 3).

The expected split is computed here from the fact sheets' rule, not from the simulator's fit: whole layers, the
last ones on the GPU, as many as fit ``free - 1024 MiB - compute - the weights outside the layers``; each CPU
layer's weights and KV (kv per layer from the gateway's math) in system RAM, plus the CPU_Mapped token embeddings
that /api/ps ``size`` counts once a model is partly offloaded.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from gateway.memory.kv import ollama_kv_cache_bytes
from kvsim.catalog import CATALOG
from kvsim.gpu.load_cost import compute_bytes
from kvsim.modelspec import ModelSpec
from tests.kvsim.helpers import GIB, fast, gateway_shape, get, post, sim_session

MIB = 2**20
FIT_TARGET = 1024 * MIB  # llama.cpp -fitt default
BIG = CATALOG["llama3.1:70b"]


def expected_split(spec: ModelSpec, *, free: int, num_ctx: int, num_batch: int = 512) -> tuple[int, int, int]:
    """(GPU layers, bytes on the GPU, bytes in system RAM) of a dense model whose layers all have the same KV."""
    n = spec.arch.n_layers
    kv_layer = ollama_kv_cache_bytes(gateway_shape(spec), num_ctx=num_ctx, num_parallel=1) // n
    layers = [w + kv_layer for w in spec.layer_weights]
    outside = spec.weights.gpu_bytes - sum(spec.layer_weights)  # output layer, norms
    room = free - FIT_TARGET - compute_bytes(spec, num_batch) - outside
    gpu_layers = 0
    while gpu_layers < n and sum(layers[n - gpu_layers - 1 :]) <= room:
        gpu_layers += 1
    on_gpu = outside + compute_bytes(spec, num_batch) + sum(layers[n - gpu_layers :])
    in_ram = sum(layers[: n - gpu_layers]) + spec.weights.host_bytes
    return gpu_layers, on_gpu, in_ram


async def ps_one(s: aiohttp.ClientSession) -> dict[str, Any]:
    (entry,) = (await get(s, "/api/ps"))[1]["models"]
    return entry  # type: ignore[no-any-return]


def test_layer_weights_are_the_layers_of_the_gpu_weights() -> None:
    for spec in (BIG, CATALOG["llama3.1:8b"], CATALOG["gemma3:27b"]):
        outside = spec.weights.gpu_bytes - sum(spec.layer_weights)
        assert len(spec.layer_weights) == spec.arch.n_layers and 0 < outside < spec.weights.gpu_bytes // 4


async def test_a_model_bigger_than_the_gpu_loads_partly_offloaded() -> None:
    async with sim_session(fast(models=("llama3.1:70b",))) as (_, s):
        status, body = await post(s, "/api/generate", {"model": "llama3.1:70b", "stream": False})
        assert (status, body["done_reason"]) == (200, "load")  # it used to be a cudaMalloc out-of-memory
        entry = await ps_one(s)
        gpu_layers, on_gpu, in_ram = expected_split(BIG, free=24 * GIB, num_ctx=32768)
        assert 0 < gpu_layers < BIG.arch.n_layers
        assert entry["context_length"] == 32768  # -c is passed: the fit never shrinks the context
        assert (entry["size_vram"], entry["size"]) == (on_gpu, on_gpu + in_ram)
        gpu = (await get(s, "/sim/gpu"))[1]
        assert gpu["devices"][0]["used_bytes"] == on_gpu <= 24 * GIB - FIT_TARGET  # the GPU part only
        assert [p["used_bytes"] for p in gpu["processes"]] == [on_gpu]
        st = (await get(s, "/sim/stats"))[1]
        assert st["host_ram_bytes"] == in_ram and st["partial_offloads"] == 1 and st["load_failures"] == 0
        (loaded,) = st["loaded"]
        assert (loaded["gpu_layers"], loaded["n_layers"]) == (gpu_layers, 80)
        assert (loaded["bytes"], loaded["host_bytes"]) == (on_gpu, in_ram)
        assert {"gpu_layers": gpu_layers, "n_layers": 80, "host_bytes": in_ram}.items() <= st["events"][-1].items()
        # it generates; unloading frees the GPU and the system RAM
        chat = {"model": "llama3.1:70b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        assert (await post(s, "/api/chat", chat))[0] == 200
        assert (await post(s, "/api/generate", {"model": "llama3.1:70b", "keep_alive": 0}))[0] == 200
        assert (await get(s, "/api/ps"))[1] == {"models": []}
        assert (await get(s, "/sim/stats"))[1]["host_ram_bytes"] == 0
        assert (await get(s, "/sim/gpu"))[1]["devices"][0]["used_bytes"] == 0


async def test_a_model_that_fits_keeps_every_layer_on_the_gpu() -> None:
    async with sim_session(fast()) as (_, s):
        assert (await post(s, "/api/generate", {"model": "llama3.1:8b"}))[0] == 200
        entry = await ps_one(s)
        assert entry["size"] == entry["size_vram"]  # "If every layer is offloaded, size is set to size_vram"
        st = (await get(s, "/sim/stats"))[1]
        assert (st["host_ram_bytes"], st["partial_offloads"]) == (0, 0)
        assert st["loaded"][0]["gpu_layers"] == st["loaded"][0]["n_layers"] == 32


async def test_the_fit_leaves_its_target_free_and_never_lowers_an_explicit_context() -> None:
    # 12 GiB: the 8B's weights fit, 8 GiB of KV at 65536 do not (without the fit: test_ollama_memory's OOM)
    async with sim_session(fast(gpu_bytes=(12 * GIB,))) as (_, s):
        body = {"model": "llama3.1:8b", "stream": False, "options": {"num_ctx": 65536}}
        assert (await post(s, "/api/generate", body))[0] == 200
        entry = await ps_one(s)
        spec = CATALOG["llama3.1:8b"]
        gpu_layers, on_gpu, in_ram = expected_split(spec, free=12 * GIB, num_ctx=65536)
        assert entry["context_length"] == 65536 and 0 < gpu_layers < 32
        assert (entry["size_vram"], entry["size"] - entry["size_vram"]) == (on_gpu, in_ram)
        assert (await get(s, "/sim/gpu"))[1]["devices"][0]["free_bytes"] >= FIT_TARGET


async def test_automatic_context_is_not_lowered_when_the_fit_can_offload() -> None:
    async with sim_session(fast(models=("qwen2.5:32b",))) as (_, s):
        body = {"model": "qwen2.5:32b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        assert (await post(s, "/api/chat", body))[0] == 200
        entry = await ps_one(s)
        assert entry["context_length"] == 32768 and entry["size_vram"] < entry["size"]
        st = (await get(s, "/sim/stats"))[1]
        assert (st["load_failures"], st["loads"], st["partial_offloads"]) == (0, 1, 1)


async def test_no_room_even_for_zero_layers_is_still_out_of_memory() -> None:
    spec = CATALOG["llama3.1:8b"]
    outside = spec.weights.gpu_bytes - sum(spec.layer_weights)
    # 1 GiB: nothing left after the fit target, so zero layers; the output layer and compute still fit
    async with sim_session(fast(gpu_bytes=(1 * GIB,))) as (_, s):
        assert (await post(s, "/api/generate", {"model": "llama3.1:8b"}))[0] == 200
        entry = await ps_one(s)
        assert entry["size_vram"] == outside + compute_bytes(spec, 512)
        assert (await get(s, "/sim/stats"))[1]["loaded"][0]["gpu_layers"] == 0
    # 512 MiB: the output layer fits, the compute buffer does not: llama-server's out-of-memory, as before
    async with sim_session(fast(gpu_bytes=(512 * MIB,))) as (_, s):
        status, body = await post(s, "/api/generate", {"model": "llama3.1:8b"})
        assert outside < 512 * MIB < outside + compute_bytes(spec, 512)
        assert status == 500
        assert body["error"].startswith("llama-server reported out-of-memory during startup: ")
        assert body["error"].endswith(
            f"allocating {compute_bytes(spec, 512) / MIB:.2f} MiB on device 0: cudaMalloc failed: out of memory"
        )
        st = (await get(s, "/sim/stats"))[1]
        assert (st["load_failures"], st["host_ram_bytes"], st["partial_offloads"]) == (1, 0, 0)


async def test_with_another_model_loaded_it_evicts_then_offloads() -> None:
    async with sim_session(fast(models=("llama3.1:8b", "llama3.1:70b"))) as (_, s):
        assert (await post(s, "/api/generate", {"model": "llama3.1:8b"}))[0] == 200
        assert (await post(s, "/api/generate", {"model": "llama3.1:70b"}))[0] == 200
        entry = await ps_one(s)  # the 8B was evicted (predicted > 80% of free), then the 70B loaded alone
        assert entry["name"] == "llama3.1:70b"
        _, on_gpu, in_ram = expected_split(BIG, free=24 * GIB, num_ctx=32768)
        assert (entry["size_vram"], entry["size"]) == (on_gpu, on_gpu + in_ram)  # as if it were the first
        st = (await get(s, "/sim/stats"))[1]
        assert (st["evictions"], st["load_failures"], st["partial_offloads"], st["host_ram_bytes"]) == (1, 0, 1, in_ram)
        # and back: the 8B does not fit beside the offloaded 70B's GPU part, so the 70B goes and the 8B is whole
        assert (await post(s, "/api/generate", {"model": "llama3.1:8b"}))[0] == 200
        entry = await ps_one(s)
        assert entry["name"] == "llama3.1:8b" and entry["size"] == entry["size_vram"]
        assert (await get(s, "/sim/stats"))[1]["host_ram_bytes"] == 0


async def test_fit_off_and_e2_never_offload() -> None:
    for cfg in (fast(models=("llama3.1:70b",), llama_fit=False), fast(models=("llama3.1:70b",), era="e2")):
        async with sim_session(cfg) as (_, s):
            status, body = await post(s, "/api/generate", {"model": "llama3.1:70b"})
            assert status == 500 and "out of memory" in body["error"]
            assert (await get(s, "/sim/stats"))[1]["partial_offloads"] == 0
