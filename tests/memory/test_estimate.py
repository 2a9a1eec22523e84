"""estimate(): the numbers of issue 3 point 6, limits that fit, JSON and table."""

from __future__ import annotations

import pytest

from gateway.memory.estimate_table import format_bytes, render_table
from gateway.memory.fit_estimate import VramRoom, estimate, parse_fit_params
from gateway.memory.kv import CacheType
from gateway.memory.load_cost import RunKnobs
from gateway.memory.presets import preset_profile

GIB = 1024**3
LLAMA_8B = preset_profile("llama3.1:8b")


@pytest.mark.parametrize(
    ("context", "cache", "kv_bytes"),
    [
        (131072, CacheType.F16, 16 * GIB),
        (8192, CacheType.F16, 1 * GIB),
        (131072, CacheType.Q8_0, 8.5 * GIB),
        (8192, CacheType.Q8_0, 0.53125 * GIB),
        (131072, CacheType.Q4_0, 4.5 * GIB),
    ],
)
def test_llama_31_8b_kv(context: int, cache: CacheType, kv_bytes: float) -> None:
    result = estimate(LLAMA_8B, context=context, knobs=RunKnobs(type_k=cache, type_v=cache))
    assert result.cost.kv_bytes == kv_bytes
    assert result.fits is None and result.max_context_tokens is None


def test_q8_0_roughly_halves_the_cache() -> None:
    f16 = estimate(LLAMA_8B, context=131072).cost.kv_bytes
    q8 = estimate(LLAMA_8B, context=131072, knobs=RunKnobs(type_k=CacheType.Q8_0, type_v=CacheType.Q8_0)).cost.kv_bytes
    assert q8 / f16 == pytest.approx(0.53, abs=0.01)


def test_verdict_and_limits_on_a_24_gib_card() -> None:
    result = estimate(
        LLAMA_8B,
        context=131072,
        parallel=2,
        knobs=RunKnobs(overhead_bytes=512 * 1024**2),
        vram=VramRoom(total_bytes=24 * GIB, free_bytes=23 * GIB),
    )
    assert result.fits is False
    assert result.headroom_bytes is not None and result.headroom_bytes < 0
    assert result.max_parallel == 1
    assert result.max_context_tokens is not None and result.max_context_tokens % 256 == 0
    at_max = estimate(
        LLAMA_8B,
        context=result.max_context_tokens,
        parallel=2,
        knobs=RunKnobs(overhead_bytes=512 * 1024**2),
        vram=VramRoom(free_bytes=23 * GIB),
    )
    above = estimate(
        LLAMA_8B,
        context=result.max_context_tokens + 256,
        parallel=2,
        knobs=RunKnobs(overhead_bytes=512 * 1024**2),
        vram=VramRoom(free_bytes=23 * GIB),
    )
    assert at_max.fits is True and above.fits is False


def test_limits_when_nothing_fits_and_when_everything_fits() -> None:
    tiny = estimate(LLAMA_8B, context=8192, vram=VramRoom(free_bytes=1 * GIB))
    assert (tiny.fits, tiny.max_context_tokens, tiny.max_parallel) == (False, 0, 0)
    huge = estimate(LLAMA_8B, context=8192, vram=VramRoom(free_bytes=10_000 * GIB))
    assert (huge.max_context_tokens, huge.max_parallel) == (131072, 256)


def test_json_has_the_documented_keys() -> None:
    data = estimate(LLAMA_8B, context=8192, vram=VramRoom(total_bytes=24 * GIB, free_bytes=24 * GIB)).to_json()
    for key in ("kv_bytes_per_token", "kv_bytes", "weights_bytes", "total_bytes", "fits", "max_context"):
        assert key in data
    assert (data["kv_bytes_per_token"], data["kv_bytes"], data["fits"]) == (131072, GIB, True)


def test_context_beyond_training_is_warned() -> None:
    result = estimate(preset_profile("phi3:mini"), context=8192)
    assert any("exceeds the model's training context 4096" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("context", "parallel", "vram", "message"),
    [(0, 1, VramRoom(), "must be > 0"), (10, 0, VramRoom(), r"allowed: 1\.\.256"),
     (10, 1, VramRoom(free_bytes=-1), "must be >= 0"), (10, 1, VramRoom(resident_bytes=-1), "must be >= 0")],
)
def test_nonsense_is_refused(context: int, parallel: int, vram: VramRoom, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        estimate(LLAMA_8B, context=context, parallel=parallel, vram=vram)


def test_table() -> None:
    table = render_table(estimate(LLAMA_8B, context=131072, vram=VramRoom(total_bytes=24 * GIB, free_bytes=24 * GIB)))
    for text in ("llama3.1:8b (preset, Q4_K_M)", "KV per token  128.0 KiB", "KV cache      16.00 GiB",
                 "verdict       fits", "max context   131,072 tokens", "headroom"):
        assert text in table
    short = render_table(estimate(LLAMA_8B, context=131072, vram=VramRoom(free_bytes=8 * GIB)))
    assert "DOES NOT FIT (short by" in short
    assert "unknown (no VRAM reading" in render_table(estimate(LLAMA_8B, context=8192))


@pytest.mark.parametrize(("n_bytes", "text"), [(None, "unknown"), (512, "512 B"), (2048, "2.0 KiB"),
                                               (3 * 1024**2, "3.0 MiB"), (-GIB, "-1.00 GiB")])
def test_format_bytes(n_bytes: int | None, text: str) -> None:
    assert format_bytes(n_bytes) == text


def test_fit_params() -> None:
    params = parse_fit_params({"model": "llama3.1:8b", "context": "8192", "cache_type_k": "q8_0"})
    assert (params.context, params.parallel, params.type_k, params.type_v) == (8192, None, CacheType.Q8_0,
                                                                               CacheType.F16)
    with pytest.raises(ValueError, match="model is required"):
        parse_fit_params({})
    with pytest.raises(ValueError, match="context is 'big'"):
        parse_fit_params({"model": "m", "context": "big"})
    with pytest.raises(ValueError, match=r"parallel is 0; allowed: 1\.\.256"):
        parse_fit_params({"model": "m", "parallel": "0"})
    with pytest.raises(ValueError, match="allowed: f32, f16"):
        parse_fit_params({"model": "m", "cache_type_v": "q3"})
