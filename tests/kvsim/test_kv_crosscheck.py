"""The simulator's KV allocation (kvsim.gpu.kv_cache, written from the fact sheets) against the gateway's
(gateway.memory.kv): two independent readings of llama.cpp's and Ollama's behaviour must agree byte for byte.

The gateway reads each catalog model as a client would, from ``/api/show``'s ``model_info``; the presets are
taken from their hyper-parameters on both sides. Both are also pinned to the numbers in kv-memory.md section 4 and
llama-server.md sections 4 and 7."""

from __future__ import annotations

import itertools

import pytest

from gateway.memory import kv as gw
from gateway.memory.kv import ServerFlags
from gateway.memory.metadata import shape_from_metadata
from gateway.memory.presets import PRESETS, Preset, preset_shape
from kvsim.catalog import CATALOG, model_info
from kvsim.gpu.kv_cache import (
    AttentionLayers,
    CacheType,
    bytes_per_token,
    kv_bytes,
    llama_server_cells,
    ollama_cells,
)

KIB, MIB = 1024, 1024 * 1024
CONTEXTS = (512, 1000, 4096, 8192, 10_000, 32768, 100_000, 131072)
PARALLEL = (1, 2, 3, 4, 8)
CACHE_TYPES = ("f16", "q8_0", "q4_0")


def preset_layers(p: Preset) -> AttentionLayers:
    period = p.swa_period
    return AttentionLayers(
        n_head_kv=(p.n_head_kv,) * p.n_layers,
        key_length=p.head_dim,
        value_length=p.head_dim,
        sliding=tuple(period > 0 and il % period < period - 1 for il in range(p.n_layers)),
        sliding_window=p.sliding_window,
        n_ctx_train=p.n_ctx_train,
    )


def architectures() -> dict[str, tuple[AttentionLayers, gw.ModelShape]]:
    """name -> (the simulator's layers, the gateway's shape) for every model with a KV cache."""
    archs = {
        f"catalog {name}": (AttentionLayers.of(spec), shape_from_metadata(model_info(spec)))
        for name, spec in sorted(CATALOG.items())
        if not spec.is_embedding
    }
    archs |= {f"preset {name}": (preset_layers(p), preset_shape(p)) for name, p in sorted(PRESETS.items())}
    return archs


ARCHS = architectures()


def test_the_grid_covers_sliding_window_and_gqa_models() -> None:
    layers = [sim for sim, _ in ARCHS.values()]
    assert len(ARCHS) >= 10
    assert any(layer.has_sliding for layer in layers)
    assert {layer.n_head_kv[0] for layer in layers} >= {4, 8, 32}


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_llama_server_allocation_agrees(name: str) -> None:
    sim, shape = ARCHS[name]
    rows = []
    for ctx, n_par, unified, cache in itertools.product(CONTEXTS, PARALLEL, (True, False), CACHE_TYPES):
        cells = llama_server_cells(sim, ctx_size=ctx, n_parallel=n_par, unified=unified)
        layout = gw.llama_server_layout(shape, ServerFlags(ctx_size=ctx, n_parallel=n_par, unified=unified))
        t = gw.parse_cache_type(cache)
        expected = gw.kv_cache_bytes(shape, layout, t, t)
        got = kv_bytes(sim, cells, CacheType(cache))
        shape_id = f"{name} -c {ctx} -np {n_par} {'-kvu' if unified else 'split'} {cache}"
        assert got == expected, f"{shape_id}: simulator {got} B, gateway {expected} B"
        assert (cells.n_ctx, cells.slot_ctx, cells.full_cells, cells.swa_cells, cells.streams) == (
            layout.n_ctx_pool, layout.n_ctx_slot, layout.cells_full, layout.cells_swa, layout.n_streams
        ), shape_id
        if ctx in (8192, 131072) and n_par in (1, 4):
            rows.append(f"{shape_id:<62} {got:>15,} B  {got / MIB:>10.2f} MiB")
    print("\n" + "\n".join(rows))


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_ollama_allocation_agrees(name: str) -> None:
    sim, shape = ARCHS[name]
    for num_ctx, num_par, cache in itertools.product((*CONTEXTS, 262144), PARALLEL, CACHE_TYPES):
        t = gw.parse_cache_type(cache)
        expected = gw.ollama_kv_cache_bytes(shape, num_ctx=num_ctx, num_parallel=num_par, type_k=t, type_v=t)
        cells = ollama_cells(sim, num_ctx=num_ctx, num_parallel=num_par)
        got = kv_bytes(sim, cells, CacheType(cache))
        assert got == expected, f"{name} num_ctx {num_ctx} x {num_par} {cache}: simulator {got}, gateway {expected}"
        assert cells.slot_ctx == gw.ollama_layout(shape, num_ctx=num_ctx, num_parallel=num_par).n_ctx_slot


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_bytes_per_token_agree(name: str) -> None:
    sim, shape = ARCHS[name]
    for cache in CACHE_TYPES:
        t = gw.parse_cache_type(cache)
        assert bytes_per_token(sim, CacheType(cache)) == gw.kv_bytes_per_token(shape, t, t)


def test_the_fact_sheets_numbers() -> None:
    llama = AttentionLayers.of(CATALOG["llama3.1:8b"])  # 32 layers, 8 KV heads, head 128
    assert [bytes_per_token(llama, CacheType(t)) for t in CACHE_TYPES] == [128 * KIB, 68 * KIB, 36 * KIB]
    for ctx, gib in ((8192, 1), (32768, 4), (131072, 16)):
        assert kv_bytes(llama, llama_server_cells(llama, ctx_size=ctx, n_parallel=1, unified=True)) == gib << 30
    one = kv_bytes(llama, ollama_cells(llama, num_ctx=16384, num_parallel=1))
    assert one == 2 << 30 and kv_bytes(llama, ollama_cells(llama, num_ctx=16384, num_parallel=2)) == 2 * one
    # the tiny model run under a real llama-server with -c 4096 -np 2: 2048 cells, 2/2 seqs, 1.00 MiB
    tiny = AttentionLayers(n_head_kv=(2, 2), key_length=16, value_length=16, sliding=(False, False), n_ctx_train=4096)
    cells = llama_server_cells(tiny, ctx_size=4096, n_parallel=2, unified=False)
    assert (bytes_per_token(tiny), cells.full_cells, cells.streams, kv_bytes(tiny, cells)) == (256, 2048, 2, MIB)
    # sliding window 1024, ubatch 512: 4608 cells unified with 4 sequences, 1536 per stream when split
    swa = AttentionLayers(n_head_kv=(8,) * 6, key_length=128, value_length=128, sliding=(True,) * 5 + (False,),
                          sliding_window=1024, n_ctx_train=131072)
    assert llama_server_cells(swa, ctx_size=32768, n_parallel=4, unified=True).swa_cells == 4608
    assert llama_server_cells(swa, ctx_size=32768, n_parallel=4, unified=False).swa_cells == 1536


def test_quantized_rows_need_whole_blocks() -> None:
    odd = AttentionLayers(n_head_kv=(1,), key_length=40, value_length=40, sliding=(False,))
    assert bytes_per_token(odd) == 160
    with pytest.raises(ValueError, match="whole blocks of 32"):
        bytes_per_token(odd, CacheType.Q8_0)
