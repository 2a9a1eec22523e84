"""residency: a loaded model's own memory is available to it; which other loaded models a load would unload."""

from __future__ import annotations

from gateway.loads.standing import plan_unload, residency, residency_json
from gateway.memory.fit_estimate import VramRoom, estimate
from gateway.memory.presets import preset_profile
from gateway.memory.sources.ollama_answers import LoadedModel

GIB = 1024**3
LLAMA_8B = preset_profile("llama3.1:8b")  # ~5.6 GiB at 8192 tokens, ~21 GiB at 131072


def _loaded(name: str, gib: float, context: int = 8192) -> LoadedModel:
    size = int(gib * GIB)
    return LoadedModel(name=name, digest="", size_bytes=size, size_vram_bytes=size, context_tokens=context,
                       expires_at=None, quantization=None)


def test_the_resident_copy_counts_as_available_up_to_the_gpu_total() -> None:
    ps = [_loaded("llama3.1:8b", 6.0)]
    here = residency("llama3.1:8b", ps)
    assert here.own is ps[0] and here.others == () and here.resident_bytes == 6 * GIB
    assert residency("phi3", [_loaded("phi3:latest", 3.0)]).resident_bytes == 3 * GIB  # same model, Ollama's tag
    result = estimate(
        LLAMA_8B,
        context=8192,
        vram=VramRoom(total_bytes=24 * GIB, free_bytes=2 * GIB, resident_bytes=here.resident_bytes),
    )
    assert result.available_bytes == 8 * GIB and result.fits is True
    stale = estimate(
        LLAMA_8B, context=8192, vram=VramRoom(total_bytes=24 * GIB, free_bytes=24 * GIB, resident_bytes=6 * GIB)
    )  # a reading from before the load: never more than the GPU
    assert stale.available_bytes == 24 * GIB


def test_unloads_the_soonest_to_expire_first_and_only_as_many_as_needed() -> None:
    ps = [_loaded("gemma3:12b", 9.0), _loaded("qwen2.5:7b", 5.0), _loaded("phi3:mini", 3.0)]  # /api/ps order
    here = residency("llama3.1:8b", ps)
    assert here.own is None and len(here.others) == 3
    cases = [  # free GiB, context -> needs_unload, would_unload
        (6, 8192, False, []),
        (4, 8192, True, ["phi3:mini"]),
        (1, 8192, True, ["phi3:mini", "qwen2.5:7b"]),
        (7, 131072, True, ["phi3:mini", "qwen2.5:7b", "gemma3:12b"]),
        (1, 131072, False, []),  # 1 + 17 GiB freed is still short of ~21 GiB
    ]
    print(f"\n{'free GiB':>8} {'context':>7} {'total GiB':>9} {'unload':>6}  would_unload")
    for free, context, needs_unload, names in cases:
        result = estimate(LLAMA_8B, context=context, vram=VramRoom(total_bytes=24 * GIB, free_bytes=free * GIB))
        plan = plan_unload(here, result)
        assert plan is not None
        body = residency_json(here, plan)
        unloaded = [entry["model"] for entry in body["would_unload"]]
        print(f"{free:>8} {context:>7} {result.total_bytes / GIB:>9.2f} {body['needs_unload']!s:>6}  {unloaded}")
        assert (body["needs_unload"], unloaded) == (needs_unload, names), (free, context)
        assert body["fits_after_unload"] is (result.fits or needs_unload)


def test_unknown_residency_is_null() -> None:
    body = residency_json(None, None)
    assert body["resident"] is None and body["needs_unload"] is None and body["would_unload"] == []
