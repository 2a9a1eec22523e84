"""Predicted KV cache sizes against a real llama-server (issue 3, point 3).

Each case generates a tiny model, starts llama-server on the CPU, and compares the prediction with the logged
``llama_kv_cache: size = ... K (..): X MiB, V (..): Y MiB`` lines (cells exactly, MiB to the printed 2 decimals)
and with the per-slot n_ctx that /props reports.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.backends.client import BackendClient
from gateway.backends.prober import LlamaServerProber, detect_backend
from gateway.memory.kv import CacheType, KvLayout, ModelShape, ServerFlags, kv_cache_parts, llama_server_layout
from gateway.memory.llama_log import bytes_to_logged_mib, parse_buffers, parse_kv_caches, parse_slots
from gateway.memory.load_cost import estimate_compute_bytes, output_buffer_bytes
from gateway.memory.sources.gguf_file import profile_from_summary
from gateway.support.gguf_reader import read_gguf
from tests.support.llama_server import RunningLlamaServer, run_llama_server
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.llama_server

GEMMA3 = {"arch": "gemma3", "n_layers": 6, "n_embd": 128, "n_head": 4, "n_head_kv": 2, "head_dim": 32}
DECI = {"arch": "deci", "n_layers": 3, "n_embd": 128, "n_head": 4, "n_head_kv": [1, 2, 4], "head_dim": 32}
LLAMA_32 = {"n_layers": 3, "n_embd": 128, "n_head": 4, "n_head_kv": 2}  # head 32: quantized K/V need 32 | head


@dataclass(frozen=True)
class Case:
    model: dict[str, Any]
    ctx_size: int | None = 4096  # None: -c not given
    parallel: int | None = 2  # None: -np not given (4 slots, unified)
    kvu: bool = False
    type_k: CacheType = CacheType.F16
    type_v: CacheType = CacheType.F16
    flash_attn: str = "on"
    swa_full: bool = False
    per_slot: int | None = None
    extra: tuple[str, ...] = field(default=())

    def args(self) -> list[str]:
        args = ["-t", "1", "--no-warmup", "-fa", self.flash_attn, "-ctk", self.type_k, "-ctv", self.type_v]
        if self.ctx_size is not None:
            args += ["-c", str(self.ctx_size)]
        if self.parallel is not None:
            args += ["-np", str(self.parallel)]
        if self.kvu:
            args.append("-kvu")
        if self.swa_full:
            args.append("--swa-full")
        if self.per_slot is not None:
            args += ["--kv-unified-per-slot", str(self.per_slot)]
        return args

    @property
    def unified(self) -> bool:
        return self.kvu or self.parallel is None

    def layout(self, shape: ModelShape) -> KvLayout:
        return llama_server_layout(
            shape,
            ServerFlags(
                ctx_size=self.ctx_size or 0,
                n_parallel=self.parallel or 4,
                unified=self.unified,
                swa_full=self.swa_full,
                kv_unified_per_slot=self.per_slot,
            ),
        )


CASES = {
    "tiny-doc-f16-split": Case({}, ctx_size=4096, parallel=2, flash_attn="auto"),
    "head32-q8_0-unified-auto-np": Case(LLAMA_32, ctx_size=4096, parallel=None, type_k=CacheType.Q8_0,
                                        type_v=CacheType.Q8_0),
    "head32-q4_0-split-np3-padded": Case(LLAMA_32, ctx_size=5000, parallel=3, type_k=CacheType.Q4_0,
                                         type_v=CacheType.Q4_0),
    "per-layer-kv-f16-no-fa": Case(DECI, ctx_size=2048, parallel=2, flash_attn="off"),
    "per-layer-kv-q8k-q4v-kvu": Case(DECI, ctx_size=3072, parallel=2, kvu=True, type_k=CacheType.Q8_0,
                                     type_v=CacheType.Q4_0),
    "swa-gemma3-f16-split": Case({**GEMMA3, "sliding_window": 256}, ctx_size=4096, parallel=2),
    "swa-gemma3-q8_0-unified": Case({**GEMMA3, "sliding_window": 256}, ctx_size=4096, parallel=None,
                                    type_k=CacheType.Q8_0, type_v=CacheType.Q8_0),
    "swa-gemma2-bool-pattern-q4_0-kvu": Case(
        {"arch": "gemma2", "n_layers": 4, "n_embd": 128, "n_head": 4, "n_head_kv": 2, "sliding_window": 128,
         "swa_pattern": [True, True, False, True]},
        ctx_size=2048, parallel=3, kvu=True, type_k=CacheType.Q4_0, type_v=CacheType.Q4_0,
    ),
    "swa-full": Case({**GEMMA3, "sliding_window": 256}, ctx_size=2048, parallel=2, swa_full=True),
    "kv-unified-per-slot-sizes-pool": Case(LLAMA_32, ctx_size=None, parallel=2, kvu=True, per_slot=1024),
}


def _get_json(server: RunningLlamaServer, path: str) -> Any:
    with urllib.request.urlopen(server.url + path, timeout=5) as response:
        return json.load(response)


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_predicted_kv_matches_llama_server(llama_server_bin: Path, case: Case) -> None:
    model = write_tiny_model(**case.model)
    shape = ModelShape.from_gguf_metadata(read_gguf(model).metadata)
    layout = case.layout(shape)
    parts = kv_cache_parts(shape, layout, case.type_k, case.type_v, flash_attn=case.flash_attn != "off")
    with run_llama_server(model, *case.args(), binary=llama_server_bin) as server:
        props = _get_json(server, "/props")
        log = server.log_text()
    logged = parse_kv_caches(log)
    expected = [(layout.cells_full, parts.k_full, parts.v_full)]
    if shape.has_swa:
        expected.append((layout.cells_swa, parts.k_swa, parts.v_swa))
    assert [(c.cells, f"{c.k_mib:.2f}", f"{c.v_mib:.2f}") for c in logged] == [
        (cells, bytes_to_logged_mib(k), bytes_to_logged_mib(v)) for cells, k, v in expected
    ]
    assert all(c.streams == layout.n_streams and c.seqs == layout.n_parallel for c in logged)
    assert all((c.type_k, c.type_v) == (case.type_k, case.type_v) for c in logged)
    assert props["default_generation_settings"]["n_ctx"] == layout.n_ctx_slot
    assert props["total_slots"] == layout.n_parallel
    slots = parse_slots(log)
    assert slots is not None
    assert (slots.n_ctx_slot, slots.kv_unified) == (layout.n_ctx_slot, layout.unified)
    # the buffer lines (MiB, 2 decimals) add ggml's tensor alignment to the same bytes
    buffers = parse_buffers(log)
    assert buffers.kv_bytes == pytest.approx(parts.total, abs=0.011 * 1024 * 1024)
    profile = profile_from_summary(read_gguf(model))
    compute = estimate_compute_bytes(profile, layout, flash_attn=case.flash_attn != "off")
    assert 0.97 * buffers.compute_bytes <= compute <= buffers.compute_bytes + 6 * 1024 * 1024
    assert output_buffer_bytes(profile, layout.n_parallel) == pytest.approx(buffers.output_bytes, abs=10_000)


async def test_prober_against_llama_server(llama_server_bin: Path) -> None:
    model = write_tiny_model()
    args = ("-t", "1", "--no-warmup", "-c", "4096", "-np", "2")
    with run_llama_server(model, *args, binary=llama_server_bin) as server:
        async with aiohttp.ClientSession() as session:
            client = BackendClient(session, server.url)
            assert await detect_backend(client) == "llama-server"
            right = LlamaServerProber(client, configured_unified=False, configured_parallel=2,
                                      configured_ctx_size=4096)
            profile = await right.profile()
            wrong = await LlamaServerProber(client, configured_unified=True, configured_parallel=2,
                                            configured_ctx_size=4096).profile()
            slots = await right.slots()
        buffers = parse_buffers(server.log_text())
    summary = read_gguf(model)
    assert (profile.context_tokens, profile.parallel, profile.shape.n_layers, profile.warnings) == (2048, 2, 2, ())
    assert profile.weights_bytes == summary.tensor_bytes
    assert [s.n_ctx for s in slots] == [2048, 2048]
    assert any("matches a split pool" in w for w in wrong.warnings)
    # CPUs with AMX or repacking kernels hold a second, repacked copy of the weights in an extra host buffer
    repacked = sum(buffers.by_device.get(device, 0) for device in ("AMX", "CPU_REPACK"))
    # (then the mapped file keeps the rest, within a percent of the tensors)
    tolerance_bytes = 0.01 * (summary.tensor_bytes if repacked else 1024 * 1024)
    assert buffers.model_bytes - repacked == pytest.approx(summary.tensor_bytes, abs=tolerance_bytes)
