"""The virtual GPU as a gateway sees it: through its exporter (nvidia_gpu_exporter text at /sim/metrics), read by
the gateway's own ExporterSource; loads, reloads, unloads and foreign processes all show."""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp
import pytest

from gateway.backends.vram_exporter import ExporterSource, devices_from_metrics
from gateway.memory.vram import DeviceMemory, ProcessMemory, VramReading, VramSource, VramUnavailable
from kvsim.app import build_state
from kvsim.gpu.exporter import EXPORTER_PATH, exporter_text
from kvsim.gpu.vgpu import VirtualGpu
from kvsim.runner import start_sim
from kvsim.state import SIM_STATE
from tests.kvsim.helpers import GIB, chat_body, fast, get, post, running_sim


def used(reading: VramReading) -> int:
    return reading.device(0).used_bytes


class SimVramSource:
    """Reads a virtual GPU in the same process: its exporter text as the gateway parses it, plus the processes
    the simulator itself knows (a real exporter reports none)."""

    name = "sim"

    def __init__(self, vgpu: VirtualGpu, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._vgpu = vgpu
        self._clock = clock

    async def read(self) -> VramReading:
        snapshot = self._vgpu.snapshot()
        devices: tuple[DeviceMemory, ...] = tuple(devices_from_metrics(exporter_text(snapshot)))
        processes = tuple(ProcessMemory(p.pid, p.device, p.used_bytes, p.name) for p in snapshot.processes)
        return VramReading(devices=devices, processes=processes, taken_at_s=self._clock(), source=self.name)


async def process_names(s: aiohttp.ClientSession) -> list[str]:
    return [p["name"] for p in (await get(s, "/sim/gpu"))[1]["processes"]]


async def test_http_source_follows_the_simulator() -> None:
    async with running_sim(fast()) as url, aiohttp.ClientSession() as session, aiohttp.ClientSession(url) as s:
        source: VramSource = ExporterSource(session, url + EXPORTER_PATH)
        empty = await source.read()
        assert (used(empty), empty.total_bytes, empty.processes, empty.source) == (0, 24 * GIB, (), "exporter")
        await post(s, "/api/chat", chat_body(options={"num_ctx": 8192}))
        loaded = await source.read()
        size = (await get(s, "/api/ps"))[1]["models"][0]["size"]
        assert used(loaded) == size and (await process_names(s))[0] == "llama-server llama3.1:8b"
        await post(s, "/api/chat", chat_body(options={"num_ctx": 32768}))  # reload: a larger KV cache
        assert used(await source.read()) > size
        _, proc = await post(s, "/sim/processes", {"name": "trainer", "bytes": 3 * GIB})
        await source.read()
        assert set(await process_names(s)) == {"llama-server llama3.1:8b", "trainer"}
        await post(s, "/api/generate", {"model": "llama3.1:8b", "keep_alive": 0})
        assert used(await source.read()) == 3 * GIB
        async with s.delete(f"/sim/processes/{proc['pid']}"):
            pass
        after = await source.read()
        assert used(after) == 0 and after.device(0).free_bytes == 24 * GIB and after.taken_at_s >= empty.taken_at_s


async def test_exporter_text_is_nvidia_gpu_exporters() -> None:
    async with running_sim(fast()) as url, aiohttp.ClientSession() as session, session.get(
        url + EXPORTER_PATH
    ) as response:
        assert response.status == 200 and response.content_type == "text/plain"
        text = await response.text()
    assert 'nvidia_smi_memory_total_bytes{uuid="SIM-GPU-0"} 25769803776' in text
    assert 'nvidia_smi_gpu_info{name="Simulated GPU 0",uuid="SIM-GPU-0"} 1' in text


async def test_http_source_reports_an_unreachable_simulator() -> None:
    async with aiohttp.ClientSession() as session:
        source = ExporterSource(session, "http://127.0.0.1:9" + EXPORTER_PATH, timeout_s=1.0)
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
        source = SimVramSource(runner.app[SIM_STATE].vgpu)
        async with aiohttp.ClientSession(url) as s:
            await post(s, "/api/generate", {"model": "llama3.1:8b"})
        assert used(await source.read()) > 5 * GIB
    finally:
        await runner.cleanup()
