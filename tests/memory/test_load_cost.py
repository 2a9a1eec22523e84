"""Load cost and calibration from what backends report (llama-server log recorded from the tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.memory.kv import CacheType
from gateway.memory.llama_log import parse_buffers, parse_kv_caches, parse_slots
from gateway.memory.load_cost import (
    Calibration,
    RunKnobs,
    apply_calibration,
    calibrate_from_log,
    calibrate_from_ps,
    estimate_load_cost,
)
from gateway.memory.presets import preset_profile
from gateway.memory.sources.gguf_file import profile_from_gguf
from tests.support.tinymodel import write_tiny_model

DATA = Path(__file__).parent / "data"
MIB = 1024 * 1024
GIB = 1024 * MIB

CUDA_LOG = """\
load_tensors: offloaded 33/33 layers to GPU
load_tensors:        CUDA0 model buffer size =  4403.49 MiB
load_tensors:   CPU_Mapped model buffer size =   281.81 MiB
llama_context:  CUDA_Host  output buffer size =     0.49 MiB
llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB
llama_kv_cache: size = 1024.00 MiB (  8192 cells,  32 layers,  1/1 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB
sched_reserve:      CUDA0 compute buffer size =   258.50 MiB
sched_reserve:  CUDA_Host compute buffer size =    24.01 MiB
"""


def test_recorded_llama_server_log() -> None:
    log = (DATA / "llama_server_load.log").read_text()
    buffers = parse_buffers(log)
    assert (buffers.model_bytes, buffers.kv_bytes) == (round(15.80 * MIB), 1 * MIB)
    assert (buffers.compute_bytes, buffers.output_bytes) == (round(3.14 * MIB), round(0.98 * MIB))
    assert buffers.gpu_bytes == 0
    (kv,) = parse_kv_caches(log)
    assert (kv.cells, kv.layers, kv.seqs, kv.streams, kv.k_mib, kv.v_mib) == (2048, 2, 2, 2, 0.5, 0.5)
    slots = parse_slots(log)
    assert slots is not None and (slots.n_slots, slots.n_ctx_slot, slots.kv_unified) == (2, 2048, False)


def test_cuda_log_splits_device_and_host_buffers() -> None:
    buffers = parse_buffers(CUDA_LOG)
    assert buffers.by_device == {
        "CUDA0": round(4403.49 * MIB) + 1024 * MIB + round(258.50 * MIB),
        "CPU": round(281.81 * MIB),
        "CUDA_Host": round(0.49 * MIB) + round(24.01 * MIB),
    }
    assert buffers.gpu_bytes == buffers.by_device["CUDA0"]


def test_only_the_last_load_counts() -> None:
    buffers = parse_buffers(CUDA_LOG + CUDA_LOG.replace("1024.00 MiB", "2048.00 MiB"))
    assert buffers.kv_bytes == 2048 * MIB


def test_load_cost_adds_up() -> None:
    cost = estimate_load_cost(
        preset_profile("llama3.1:8b"), context_tokens=8192, parallel=2, knobs=RunKnobs(overhead_bytes=MIB)
    )
    assert cost.kv_bytes == 2 * GIB
    assert cost.total_bytes == (
        cost.weights_bytes + cost.kv_bytes + cost.compute_bytes + cost.output_bytes + cost.overhead_bytes
    )
    assert cost.buffers_bytes == cost.total_bytes - MIB
    assert (cost.layout.cells_full, cost.layout.n_streams) == (8192, 2)


def test_unified_pool_is_context_tokens_in_total() -> None:
    cost = estimate_load_cost(
        preset_profile("llama3.1:8b"), context_tokens=8192, parallel=4, knobs=RunKnobs(unified=True)
    )
    assert cost.kv_bytes == 1 * GIB
    assert cost.layout.n_ctx_slot == 8192


def test_quantized_cache_and_refusals() -> None:
    profile = preset_profile("llama3.1:8b")
    q8 = estimate_load_cost(
        profile, context_tokens=8192, parallel=1, knobs=RunKnobs(type_k=CacheType.Q8_0, type_v=CacheType.Q8_0)
    )
    assert q8.kv_bytes == 68 * 1024 * 8192
    with pytest.raises(ValueError, match="must be > 0"):
        estimate_load_cost(profile, context_tokens=0, parallel=1)
    with pytest.raises(ValueError, match="overhead"):
        estimate_load_cost(profile, context_tokens=1, parallel=1, knobs=RunKnobs(overhead_bytes=-1))


def test_calibration_from_the_recorded_log() -> None:
    profile = profile_from_gguf(write_tiny_model())
    cost = estimate_load_cost(profile, context_tokens=2048, parallel=2)
    buffers = parse_buffers((DATA / "llama_server_load.log").read_text())
    calibration = calibrate_from_log(cost, buffers)
    calibrated = apply_calibration(cost, calibration)
    assert calibrated.compute_bytes == pytest.approx(buffers.compute_bytes, abs=1)
    assert calibrated.weights_bytes == buffers.model_bytes
    assert calibrated.kv_bytes == cost.kv_bytes == buffers.kv_bytes
    later = estimate_load_cost(profile, context_tokens=4096, parallel=2, knobs=RunKnobs(calibration=calibration))
    assert later.compute_bytes > calibrated.compute_bytes


def test_calibration_from_ollama_ps() -> None:
    profile = preset_profile("llama3.1:8b")
    cost = estimate_load_cost(profile, context_tokens=8192, parallel=1)
    reported_compute = 300 * MIB
    size = cost.weights_bytes + cost.kv_bytes + cost.output_bytes + reported_compute
    calibration = calibrate_from_ps(cost, size_bytes=size, size_vram_bytes=size // 2)
    assert calibration.gpu_fraction == pytest.approx(0.5)
    assert apply_calibration(cost, calibration).compute_bytes == pytest.approx(reported_compute, abs=1)
    assert apply_calibration(cost, Calibration()).compute_bytes == cost.compute_bytes
