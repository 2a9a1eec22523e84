"""VRAM sources: NVML through a fake replaying recorded H200 answers, exporter text over loopback, static."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest

from gateway.backends.vram_exporter import ExporterSource, devices_from_metrics, parse_prometheus_text
from gateway.memory.vram import CachedVramSource, StaticVramSource, VramReading, VramUnavailable, parse_size
from gateway.memory.vram_nvml import NvmlSource
from tests.memory.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeNvml, FakeNVMLError
from tests.support.clock import FakeClock
from tests.support.fake_backend import serve, text_answer

DATA = Path(__file__).parent / "data"
MIB = 1024 * 1024
H200_TOTAL = 150_754_820_096
H200_UUID = "GPU-a9959ca8-fb66-2a69-f72f-b583b6b87519"


async def test_nvml_reading_of_an_idle_h200() -> None:
    clock = FakeClock(50.0)
    reading = await NvmlSource(FakeNvml.from_file("nvml_h200_idle.json"), clock=clock).read()
    (device,) = reading.devices
    assert (device.name, device.uuid, device.total_bytes) == ("NVIDIA H200", H200_UUID, H200_TOTAL)
    assert (device.used_bytes, device.free_bytes) == (0, 150_109_880_320)  # v2: reserved memory is not "used"
    assert reading.processes == ()
    assert reading.source == "nvml"
    clock.advance(2.5)
    assert reading.age_s(clock()) == 2.5


async def test_nvml_reading_with_a_process() -> None:
    reading = await NvmlSource(FakeNvml.from_file("nvml_h200_one_process.json")).read()
    assert reading.used_bytes == 2_699_886_592  # nvidia-smi showed 2575 MiB
    assert round(reading.used_bytes / MIB) == 2575
    (proc,) = reading.processes
    assert (proc.pid, proc.device_index, proc.used_bytes, proc.name) == (
        425, 0, 2_690_646_016, "/opt/torch/.venv/bin/python3"
    )


async def test_nvml_without_v2_struct_reports_v1_used() -> None:
    fake = FakeNvml.from_file("nvml_h200_one_process.json", v2=False)
    reading = await NvmlSource(fake).read()
    assert reading.used_bytes == 3_344_826_368  # v1 "used" includes the 615 MiB the driver reserves


async def test_nvml_missing_process_name_is_none() -> None:
    fake = FakeNvml.from_file("nvml_h200_one_process.json")
    fake.recording["process_names"] = {}
    (proc,) = (await NvmlSource(fake).read()).processes
    assert proc.name is None


async def test_nvml_missing_driver_is_unavailable_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml.from_file(
        "nvml_h200_idle.json", init_error=FakeNVMLError(NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found")
    )
    source = NvmlSource(fake)
    with caplog.at_level(logging.WARNING, logger="gateway.memory.vram_nvml"):
        for _ in range(3):
            with pytest.raises(VramUnavailable, match="NVML Shared Library Not Found"):
                await source.read()
    assert len(caplog.records) == 1
    assert "NVML VRAM source unavailable" in caplog.records[0].getMessage()


async def test_nvml_recovers_after_a_failure() -> None:
    fake = FakeNvml.from_file("nvml_h200_idle.json", init_error=FakeNVMLError(999, "Unknown Error"))
    source = NvmlSource(fake)
    with pytest.raises(VramUnavailable):
        await source.read()
    fake.init_error = None
    assert (await source.read()).total_bytes == H200_TOTAL


def test_nvml_close_shuts_down_once() -> None:
    fake = FakeNvml.from_file("nvml_h200_idle.json")
    source = NvmlSource(fake)
    source.read_sync()
    source.close()
    source.close()
    assert fake.calls == ["nvmlInit", "nvmlShutdown"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * 1024**3),
        ("24 GiB", 24 * 1024**3),
        ("24G", 24 * 1024**3),
        ("24GB", 24 * 10**9),
        ("512MiB", 512 * MIB),
        ("1.5TiB", int(1.5 * 1024**4)),
        ("80000000000", 80_000_000_000),
        ("8gib", 8 * 1024**3),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "24 GiBs", "-1GiB", "0", "24XB"])
def test_parse_size_refuses_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="GiB"):
        parse_size(text)


async def test_static_source() -> None:
    reading = await StaticVramSource.from_text("24GiB", clock=FakeClock(7.0)).read()
    assert (reading.total_bytes, reading.free_bytes, reading.used_bytes) == (24 * 1024**3, 24 * 1024**3, 0)
    assert reading.taken_at_s == 7.0


class CountingSource:
    name = "counting"

    def __init__(self, clock: FakeClock) -> None:
        self.reads = 0
        self.clock = clock

    async def read(self) -> VramReading:
        self.reads += 1
        return await StaticVramSource(1000 + self.reads, clock=self.clock).read()


async def test_cache_refreshes_after_the_period() -> None:
    clock = FakeClock()
    inner = CountingSource(clock)
    cached = CachedVramSource(inner, refresh_s=2.0, clock=clock)
    first = await cached.read()
    clock.advance(1.5)
    assert await cached.read() is first
    assert first.age_s(clock()) == 1.5
    clock.advance(0.5)
    second = await cached.read()
    assert second.total_bytes == 1002
    assert inner.reads == 2


def test_prometheus_parser_handles_labels_and_comments() -> None:
    samples = parse_prometheus_text('# HELP x\nfoo{a="1",b="q\\"x"} 2.5e3\nbar 7 1700000000\nbad line\n')
    assert [(s.name, s.labels, s.value) for s in samples] == [("foo", {"a": "1", "b": 'q"x'}, 2500.0), ("bar", {}, 7.0)]


@pytest.mark.parametrize(
    ("filename", "uuid", "used_mib"),
    [("dcgm_exporter_h200.txt", H200_UUID, 2575), ("nvidia_gpu_exporter_h200.txt", H200_UUID[4:], 2575)],
)
async def test_exporter_over_loopback(filename: str, uuid: str, used_mib: int) -> None:
    text = (DATA / filename).read_text()
    async with serve({("GET", "/metrics"): text_answer(text)}) as base, aiohttp.ClientSession() as session:
        reading = await ExporterSource(session, f"{base}/metrics", clock=FakeClock(3.0)).read()
    (device,) = reading.devices
    assert (device.index, device.name, device.uuid) == (0, "NVIDIA H200", uuid)
    assert round(device.used_bytes / MIB) == used_mib
    assert abs(device.total_bytes - H200_TOTAL) <= 2 * MIB
    assert reading.source == "exporter"
    assert reading.taken_at_s == 3.0


async def test_exporter_errors_are_unavailable() -> None:
    routes = {("GET", "/broken"): text_answer("down", status=503),
              ("GET", "/unrelated"): text_answer("process_cpu_seconds_total 12\n")}
    async with serve(routes) as base, aiohttp.ClientSession() as session:
        with pytest.raises(VramUnavailable, match="HTTP 503"):
            await ExporterSource(session, f"{base}/broken").read()
        with pytest.raises(VramUnavailable, match="DCGM_FI_DEV_FB_USED"):
            await ExporterSource(session, f"{base}/unrelated").read()
        with pytest.raises(VramUnavailable, match="unreachable"):
            await ExporterSource(session, "http://127.0.0.1:9/metrics", timeout_s=0.5).read()


def test_dcgm_multi_gpu_sorted_by_index() -> None:
    lines = [
        f'DCGM_FI_DEV_FB_{kind}{{gpu="{gpu}",UUID="GPU-{gpu}",modelName="RTX 4090"}} {value}'
        for gpu, used, free in ((1, 100, 24000), (0, 200, 23900))
        for kind, value in (("USED", used), ("FREE", free))
    ]
    devices = devices_from_metrics("\n".join(lines))
    assert [(d.index, d.used_bytes // MIB, d.total_bytes // MIB) for d in devices] == [(0, 200, 24100), (1, 100, 24100)]
