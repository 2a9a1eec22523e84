"""VRAM from the NVIDIA driver through pynvml (nvidia-ml-py).

The pynvml module is injected, so tests pass a fake that replays recorded readings. Every NVML failure (no
driver, no GPU, no permission) becomes VramUnavailable, logged once per distinct reason, never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from gateway.memory.vram import Clock, DeviceMemory, ProcessMemory, VramReading, VramUnavailable

logger = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSource:
    name = "nvml"

    def __init__(self, nvml: Any, *, clock: Clock = time.monotonic) -> None:
        self._nvml = nvml
        self._error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._clock = clock
        self._initialized = False
        self._logged: set[str] = set()

    async def read(self) -> VramReading:
        return await asyncio.to_thread(self.read_sync)

    def read_sync(self) -> VramReading:
        try:
            self._ensure_init()
            reading = self._read()
        except self._error as exc:
            raise self._unavailable(f"NVML error: {exc}") from exc
        except OSError as exc:
            raise self._unavailable(f"NVML library cannot be used: {exc}") from exc
        return reading

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            with contextlib.suppress(self._error):
                self._nvml.nvmlShutdown()

    def _unavailable(self, reason: str) -> VramUnavailable:
        if reason not in self._logged:
            self._logged.add(reason)
            logger.warning("NVML VRAM source unavailable: %s", reason)
        self.close()
        return VramUnavailable(reason)

    def _ensure_init(self) -> None:
        if not self._initialized:
            self._nvml.nvmlInit()
            self._initialized = True

    def _memory(self, handle: Any) -> Any:
        v2 = getattr(self._nvml, "nvmlMemory_v2", None)
        if v2 is not None:
            try:  # v2 splits driver-reserved memory out of "used", as nvidia-smi shows it
                return self._nvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
            except (self._error, TypeError):
                pass
        return self._nvml.nvmlDeviceGetMemoryInfo(handle)

    def _read(self) -> VramReading:
        nvml = self._nvml
        devices: list[DeviceMemory] = []
        processes: list[ProcessMemory] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = self._memory(handle)
            devices.append(
                DeviceMemory(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    total_bytes=int(memory.total),
                    used_bytes=int(memory.used),
                    free_bytes=int(memory.free),
                )
            )
            processes.extend(self._processes(index, handle))
        return VramReading(devices=tuple(devices), processes=tuple(processes), taken_at_s=self._clock(), source="nvml")

    def _processes(self, index: int, handle: Any) -> list[ProcessMemory]:
        seen: dict[int, ProcessMemory] = {}
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                running = getattr(self._nvml, getter)(handle)
            except (self._error, AttributeError):
                continue
            for proc in running:
                used = getattr(proc, "usedGpuMemory", None)
                if int(proc.pid) not in seen:
                    seen[int(proc.pid)] = ProcessMemory(
                        pid=int(proc.pid),
                        device_index=index,
                        used_bytes=int(used) if used is not None else None,
                        name=self._process_name(int(proc.pid)),
                    )
        return list(seen.values())

    def _process_name(self, pid: int) -> str | None:
        try:
            return _text(self._nvml.nvmlSystemGetProcessName(pid))
        except self._error:
            return None


def nvml_source(*, clock: Clock = time.monotonic) -> NvmlSource:
    """An NvmlSource over the installed pynvml; VramUnavailable when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError as exc:
        raise VramUnavailable("pynvml (nvidia-ml-py) is not installed") from exc
    return NvmlSource(pynvml, clock=clock)
