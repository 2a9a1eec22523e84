"""The virtual GPU as a VRAM source: a gateway sees loads, reloads, unloads and foreign processes."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.memory.vram import VramReading, VramSource, VramUnavailable
from kvsim.app import build_state
from kvsim.runner import start_sim
from kvsim.vram import HttpSimVramSource, SimVramSource, vram_source_of
from tests.sim.helpers import GIB, chat_body, fast, get, post, running_sim


def used(reading: VramReading) -> int:
    return reading.device(0).used_bytes


async def test_http_source_follows_the_simulator() -> None:
    async with running_sim(fast()) as url, aiohttp.ClientSession() as session, aiohttp.ClientSession(url) as s:
        source: VramSource = HttpSimVramSource(session, url)
        empty = await source.read()
        assert (used(empty), empty.total_bytes, empty.processes, empty.source) == (0, 24 * GIB, (), "sim")
        await post(s, "/api/chat", chat_body(options={"num_ctx": 8192}))
        loaded = await source.read()
        size = (await get(s, "/api/ps"))[1]["models"][0]["size"]
        assert used(loaded) == size and loaded.processes[0].name == "llama-server llama3.1:8b"
        await post(s, "/api/chat", chat_body(options={"num_ctx": 32768}))  # reload: a larger KV cache
        assert used(await source.read()) > size
        _, proc = await post(s, "/sim/processes", {"name": "trainer", "bytes": 3 * GIB})
        with_trainer = await source.read()
        assert {p.name for p in with_trainer.processes} == {"llama-server llama3.1:8b", "trainer"}
        await post(s, "/api/generate", {"model": "llama3.1:8b", "keep_alive": 0})
        assert used(await source.read()) == 3 * GIB
        async with s.delete(f"/sim/processes/{proc['pid']}"):
            pass
        after = await source.read()
        assert used(after) == 0 and after.device(0).free_bytes == 24 * GIB and after.taken_at_s >= empty.taken_at_s


async def test_http_source_reports_an_unreachable_simulator() -> None:
    async with aiohttp.ClientSession() as session:
        source = HttpSimVramSource(session, "http://127.0.0.1:9", timeout_s=1.0)
        with pytest.raises(VramUnavailable):
            await source.read()


async def test_in_process_source_and_multi_gpu_split() -> None:
    state = build_state(fast(gpu_bytes=(24 * GIB, 24 * GIB)))
    source: VramSource = SimVramSource(state.vgpu, clock=lambda: 12.5)
    state.vgpu.add_foreign("desktop", 1, GIB)
    reading = await source.read()
    assert [d.free_bytes for d in reading.devices] == [24 * GIB, 23 * GIB] and reading.taken_at_s == 12.5
    assert reading.processes[0].device_index == 1 and reading.device(1).uuid == "SIM-GPU-1"


async def test_a_model_larger_than_one_gpu_is_split_across_both() -> None:
    config = fast(models=("llama3.1:70b",), gpu_bytes=(24 * GIB, 24 * GIB))
    async with running_sim(config) as url, aiohttp.ClientSession(url) as s:
        body = {
            "model": "llama3.1:70b",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": False,
            "options": {"num_ctx": 4096},
        }
        assert (await post(s, "/api/chat", body))[0] == 200
        devices = (await get(s, "/sim/gpu"))[1]["devices"]
        assert all(d["used_bytes"] > 19 * GIB for d in devices)


async def test_vram_source_of_a_started_simulator() -> None:
    runner, url = await start_sim(fast())
    try:
        source = vram_source_of(runner)
        async with aiohttp.ClientSession(url) as s:
            await post(s, "/api/generate", {"model": "llama3.1:8b"})
        assert used(await source.read()) > 5 * GIB
    finally:
        await runner.cleanup()
