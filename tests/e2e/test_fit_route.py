"""GET /kvgate/fit serves the same answer as `kvgate estimate`, with the backend's live VRAM reading."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest

from gateway.cli import estimate as estimate_cli
from gateway.cli.main import build_parser
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

GIB = 1 << 30


@pytest.fixture
async def gateway() -> AsyncIterator[str]:
    async with running(FakeLLM()) as fake, running_gateway(
        [{"name": "gpu0", "url": fake.url, "vram": "24GiB"}]
    ) as url:
        yield url


async def _fit(url: str, query: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/fit?{query}") as response:
        return response.status, orjson.loads(await response.read())


async def test_fit_reproduces_the_llama_3_1_8b_guide_numbers(gateway: str) -> None:
    status, at_128k = await _fit(gateway, "model=llama3.1:8b&context=131072")
    assert status == 200
    assert at_128k["kv_bytes_per_token"] == 128 * 1024
    assert at_128k["kv_bytes"] == 16 * GIB
    assert at_128k["vram_total_bytes"] == 24 * GIB and at_128k["backend"] == "gpu0"
    _, at_8k = await _fit(gateway, "model=llama3.1:8b&context=8192")
    assert at_8k["kv_bytes"] == GIB and at_8k["fits"] is True
    _, q8 = await _fit(gateway, "model=llama3.1:8b&context=131072&cache_type_k=q8_0&cache_type_v=q8_0")
    assert q8["kv_bytes"] == 17 * GIB // 2


async def test_fit_matches_the_cli(gateway: str) -> None:
    _, served = await _fit(gateway, "model=qwen2.5:7b&context=32768&parallel=2")
    args = build_parser().parse_args(
        ["estimate", "qwen2.5:7b", "--context", "32768", "--parallel", "2", "--vram", "24GiB", "--json"])
    out = io.StringIO()
    assert await estimate_cli.run(args, out=out) == 0
    printed = orjson.loads(out.getvalue())
    for key in ("kv_bytes_per_token", "kv_bytes", "weights_bytes", "total_bytes", "fits", "max_context"):
        assert served[key] == printed[key], key


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("context=8192", "model is required"),
        ("model=llama3.1:8b&context=-5", "context is -5; allowed: 1.."),
        ("model=llama3.1:8b&cache_type_k=q3", "allowed: f32, f16"),
        ("model=llama3.1:8b&backend=nope", "known backends: gpu0"),
    ],
)
async def test_fit_refuses_nonsense_naming_the_value(gateway: str, query: str, expected: str) -> None:
    status, body = await _fit(gateway, query)
    assert status == 400
    error = body["error"]
    assert isinstance(error, dict) and expected in str(error["message"])


async def test_fit_against_the_simulator_uses_its_profile_live_vram_and_ps_calibration() -> None:
    from kvsim.config import SimConfig
    from kvsim.gpu.exporter import EXPORTER_PATH
    from kvsim.runner import start_sim

    runner, sim = await start_sim(SimConfig(models=("llama3.1:8b", "qwen2.5:7b"), load_s=0.05, time_scale=50.0))
    backend = {"name": "sim", "url": sim, "vram": sim + EXPORTER_PATH, "vram_refresh_s": 0.01, "parallel": 1}
    try:
        async with running_gateway([backend]) as url:
            _, before = await _fit(url, "model=llama3.1:8b&context=8192")
            assert before["source"] == "ollama" and before["calibrated_from"] is None
            assert before["vram_free_bytes"] == 24 * GIB and before["vram_source"] == "exporter"
            async with aiohttp.ClientSession() as http, http.post(
                f"{sim}/api/generate", json={"model": "qwen2.5:7b", "prompt": "", "options": {"num_ctx": 8192}}
            ) as response:
                assert response.status == 200  # loads qwen: the GPU has less free now

            async def refreshed() -> dict[str, object] | None:  # once the reading is older than vram_refresh_s
                _, after = await _fit(url, "model=llama3.1:8b&context=8192")
                return after if after["vram_free_bytes"] != before["vram_free_bytes"] else None

            after = await until(refreshed)
            assert after is not None
            assert isinstance(after["vram_free_bytes"], int) and after["vram_free_bytes"] < 24 * GIB - 4 * GIB
            async with aiohttp.ClientSession() as http, http.post(
                f"{sim}/api/generate", json={"model": "llama3.1:8b", "prompt": "", "options": {"num_ctx": 8192}}
            ) as response:
                assert response.status == 200
            _, loaded = await _fit(url, "model=llama3.1:8b&context=8192")
            assert loaded["calibrated_from"] == "ollama /api/ps"
            assert loaded["kv_bytes"] == GIB
    finally:
        await runner.cleanup()


@pytest.fixture
async def sim_with_llama_loaded() -> AsyncIterator[tuple[str, str]]:
    """The simulator (one 24 GiB GPU) behind a gateway that reads its VRAM exporter, with llama3.1:8b loaded at
    num_ctx 65536 (about 13.3 GiB: more than the ~10.7 GiB left free). Yields (gateway URL, simulator URL)."""
    from kvsim.config import SimConfig
    from kvsim.gpu.exporter import EXPORTER_PATH
    from kvsim.runner import start_sim

    runner, sim = await start_sim(SimConfig(models=("llama3.1:8b", "qwen2.5:7b"), load_s=0.05, time_scale=50.0))
    backend = {"name": "sim", "url": sim, "vram": sim + EXPORTER_PATH, "vram_refresh_s": 0.01, "parallel": 1}
    try:
        async with running_gateway([backend]) as url:
            async with aiohttp.ClientSession() as http, http.post(
                f"{sim}/api/generate", json={"model": "llama3.1:8b", "prompt": "", "options": {"num_ctx": 65536}}
            ) as response:
                assert response.status == 200

            async def loaded_and_read() -> bool:  # /api/ps shows it and the VRAM reading is newer than the load
                _, body = await _fit(url, "model=llama3.1:8b")
                return body["resident"] is True and body["vram_free_bytes"] != 24 * GIB

            await until(loaded_and_read)
            yield url, sim
    finally:
        await runner.cleanup()


async def test_a_loaded_model_counts_its_own_memory_as_available(sim_with_llama_loaded: tuple[str, str]) -> None:
    url, sim = sim_with_llama_loaded
    _, body = await _fit(url, "model=llama3.1:8b&context=65536")
    free, total, own = body["vram_free_bytes"], body["total_bytes"], body["resident_bytes"]
    assert isinstance(free, int) and isinstance(total, int) and isinstance(own, int)
    assert free < total  # free VRAM alone (the old rule) would say it does not fit
    assert body["fits"] is True and body["resident"] is True and body["resident_context"] == 65536
    assert own > 13 * GIB and body["vram_available_bytes"] == min(free + own, 24 * GIB)
    assert body["needs_unload"] is False and body["would_unload"] == []
    assert isinstance(body["max_context"], int) and body["max_context"] >= 65536
    _, default = await _fit(url, "model=llama3.1:8b")  # no context asked: the one it is loaded with
    assert default["context"] == 65536 and default["fits"] is True

    args = build_parser().parse_args(
        ["estimate", "llama3.1:8b", "--backend", sim, "--vram", sim + "/sim/metrics", "--json"])
    out = io.StringIO()
    assert await estimate_cli.run(args, out=out) == 0
    printed = orjson.loads(out.getvalue())
    for key in ("context", "total_bytes", "fits", "resident", "resident_bytes", "resident_context", "needs_unload"):
        assert printed[key] == body[key], key
    table = io.StringIO()
    assert await estimate_cli.run(build_parser().parse_args(
        ["estimate", "llama3.1:8b", "--backend", sim, "--vram", sim + "/sim/metrics"]), out=table) == 0
    assert "resident: yes" in table.getvalue()


async def test_fit_says_whether_a_load_needs_an_unload_first(sim_with_llama_loaded: tuple[str, str]) -> None:
    url, _ = sim_with_llama_loaded
    cases = [  # query, fits now, needs_unload, would_unload, fits_after_unload
        ("model=llama3.1:8b&context=65536", True, False, [], True),  # resident, at its loaded context
        ("model=qwen2.5:7b&context=8192", True, False, [], True),  # fits beside llama
        ("model=qwen2.5:7b&context=32768&parallel=4", False, True, ["llama3.1:8b"], True),  # only without llama
        ("model=qwen2.5:7b&context=131072&parallel=4", False, False, [], False),  # not even on an empty GPU
    ]
    print(f"\n{'query':<46} {'total GiB':>9} {'avail GiB':>9} {'fits':>5} {'unload':>6} {'after':>5}  would_unload")
    for query, fits, needs_unload, would_unload, after in cases:
        status, body = await _fit(url, query)
        assert status == 200
        total, available = body["total_bytes"], body["vram_available_bytes"]
        assert isinstance(total, int) and isinstance(available, int)
        unload = body["would_unload"]
        assert isinstance(unload, list)
        names = [entry["model"] for entry in unload]
        print(f"{query:<46} {total / GIB:>9.2f} {available / GIB:>9.2f} {body['fits']!s:>5} "
              f"{body['needs_unload']!s:>6} {body['fits_after_unload']!s:>5}  {names}")
        assert (body["fits"], body["needs_unload"], names, body["fits_after_unload"]) == (
            fits, needs_unload, would_unload, after), query
        if needs_unload:
            assert unload[0]["size_vram_bytes"] > 13 * GIB and total <= available + unload[0]["size_vram_bytes"]
        if not after:
            warnings = body["warnings"]
            assert isinstance(warnings, list) and any("even after unloading" in str(w) for w in warnings)


async def test_fit_states_the_system_ram_a_partial_offload_needs(gateway: str) -> None:
    from gateway.memory.host_ram import HostRam, ram_verdict

    status, body = await _fit(gateway, "model=llama3.1:8b&context=131072&parallel=2")  # ~37 GiB on a 24 GiB GPU
    assert status == 200 and body["fits"] is False
    ram, available, swap_free = body["ram_bytes"], body["ram_available_bytes"], body["ram_swap_free_bytes"]
    weights, kv = body["weights_bytes"], body["kv_bytes"]
    gpu_layers, cpu_layers = body["gpu_layers"], body["cpu_layers"]
    assert isinstance(ram, int) and isinstance(available, int) and isinstance(swap_free, int)
    assert isinstance(weights, int) and isinstance(kv, int)
    assert isinstance(gpu_layers, int) and isinstance(cpu_layers, int) and gpu_layers + cpu_layers == 32
    assert 0 < cpu_layers < 32 and abs(ram - (weights + kv) * cpu_layers / 32) <= 1
    host = HostRam(total_bytes=0, available_bytes=available, swap_total_bytes=0, swap_free_bytes=swap_free)
    assert body["ram_verdict"] == ram_verdict(ram, host).value
    assert "kvgate host" in str(body["ram_note"]) and "same host" in str(body["ram_note"])
    for key in ("kv_bytes_per_token", "total_bytes", "max_context", "vram_available_bytes", "backend"):
        assert key in body, key  # the existing fields stay
    _, small = await _fit(gateway, "model=llama3.1:8b&context=8192")
    assert small["ram_bytes"] == 0 and "ram_verdict" not in small
