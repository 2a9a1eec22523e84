"""VRAM from a Prometheus exporter's /metrics text.

dcgm-exporter:        DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_FREE (and _RESERVED), in MiB, labels gpu, UUID, modelName
nvidia_gpu_exporter:  nvidia_smi_memory_used_bytes / _free_bytes / _total_bytes, labels uuid; nvidia_smi_index
                      and nvidia_smi_gpu_info{name=...} give the index and the name

Exporters report no per-process usage. The source reads the URL with the backends' one HTTP call (``client.fetch``:
its timeouts and its table of transport errors), so it sits in this package, above the memory math it fills in.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass

import aiohttp
from yarl import URL

from gateway.backends.client import BackendCallError, Call, fetch
from gateway.config.settings import TimeoutSettings
from gateway.memory.vram import Clock, DeviceMemory, VramReading, VramUnavailable
from gateway.support.redact import mask_url

MIB = 1024 * 1024
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus_text(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(match["labels"] or "")}
        samples.append(Sample(match["name"], labels, value))
    return samples


def _dcgm_devices(samples: list[Sample]) -> list[DeviceMemory]:
    fields: dict[str, dict[str, float]] = defaultdict(dict)
    info: dict[str, tuple[int, str]] = {}
    for s in samples:
        if s.name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"):
            uuid = s.labels.get("UUID") or s.labels.get("uuid") or s.labels.get("gpu", "")
            fields[uuid][s.name] = s.value
            info[uuid] = (int(s.labels.get("gpu", len(info))), s.labels.get("modelName", ""))
    devices = []
    for uuid, values in fields.items():
        if "DCGM_FI_DEV_FB_USED" not in values or "DCGM_FI_DEV_FB_FREE" not in values:
            continue
        used = round(values["DCGM_FI_DEV_FB_USED"] * MIB)
        free = round(values["DCGM_FI_DEV_FB_FREE"] * MIB)
        reserved = round(values.get("DCGM_FI_DEV_FB_RESERVED", 0.0) * MIB)
        index, name = info[uuid]
        devices.append(DeviceMemory(index, name, uuid, used + free + reserved, used, free))
    return devices


def _nvidia_smi_devices(samples: list[Sample]) -> list[DeviceMemory]:
    fields: dict[str, dict[str, float]] = defaultdict(dict)
    names: dict[str, str] = {}
    for s in samples:
        uuid = s.labels.get("uuid", "")
        if s.name.startswith("nvidia_smi_memory_") or s.name == "nvidia_smi_index":
            fields[uuid][s.name] = s.value
        elif s.name == "nvidia_smi_gpu_info":
            names[uuid] = s.labels.get("name", "")
    devices = []
    for position, (uuid, values) in enumerate(fields.items()):
        used = values.get("nvidia_smi_memory_used_bytes")
        total = values.get("nvidia_smi_memory_total_bytes")
        if used is None or total is None:
            continue
        free = values.get("nvidia_smi_memory_free_bytes", total - used)
        index = int(values.get("nvidia_smi_index", position))
        devices.append(DeviceMemory(index, names.get(uuid, ""), uuid, round(total), round(used), round(free)))
    return devices


def devices_from_metrics(text: str) -> list[DeviceMemory]:
    """GPU memory per device from exporter text; VramUnavailable when no known metric is present."""
    samples = parse_prometheus_text(text)
    devices = _dcgm_devices(samples) or _nvidia_smi_devices(samples)
    if not devices:
        raise VramUnavailable(
            "exporter text has neither DCGM_FI_DEV_FB_USED/FREE (dcgm-exporter) nor "
            "nvidia_smi_memory_used_bytes/total_bytes (nvidia_gpu_exporter)"
        )
    return sorted(devices, key=lambda d: d.index)


class ExporterSource:
    name = "exporter"

    def __init__(
        self, session: aiohttp.ClientSession, url: str, *, timeout_s: float = 5.0, clock: Clock = time.monotonic
    ) -> None:
        self._session = session
        self._url = url
        self._timeouts = TimeoutSettings(connect_s=timeout_s, first_byte_s=timeout_s)
        self._clock = clock

    async def read(self) -> VramReading:
        try:
            raw = await fetch(self._session, Call("GET", URL(self._url)), where=f"exporter {mask_url(self._url)}",
                              timeouts=self._timeouts)
        except BackendCallError as exc:
            raise VramUnavailable(exc.message) from exc
        devices = devices_from_metrics(raw.decode(errors="replace"))
        return VramReading(devices=tuple(devices), processes=(), taken_at_s=self._clock(), source=self.name)
