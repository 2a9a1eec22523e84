"""A fake of the pynvml functions kvgate calls, replaying answers recorded on a real GPU.

Recordings (tests/memory/data/nvml_*.json) come from ``scripts/nvml_check.py --record`` on an NVIDIA H200,
driver 580.159.04: idle, and with one process holding 2 GiB through the CUDA driver API.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DATA_DIR = Path(__file__).parent / "data"


class FakeNVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4


@dataclass
class _Handle:
    index: int


class FakeNvml:
    """Module-like object: pass it where kvgate expects the pynvml module."""

    NVMLError = FakeNVMLError
    nvmlMemory_v2 = 33554472

    def __init__(self, recording: dict[str, Any], *, init_error: FakeNVMLError | None = None, v2: bool = True) -> None:
        self.recording = recording
        self.init_error = init_error
        self.calls: list[str] = []
        self.initialized = False
        if not v2:
            self.nvmlMemory_v2 = None  # type: ignore[assignment]  # an older pynvml without the v2 struct

    @classmethod
    def from_file(cls, name: str, **kwargs: Any) -> FakeNvml:
        return cls(json.loads((DATA_DIR / name).read_text()), **kwargs)

    def _device(self, handle: _Handle) -> dict[str, Any]:
        self._check()
        device: dict[str, Any] = self.recording["devices"][handle.index]
        return device

    def _check(self) -> None:
        if not self.initialized:
            raise FakeNVMLError(1, "Uninitialized")

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.recording["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check()
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return str(self._device(handle)["name"])

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return str(self._device(handle)["uuid"])

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> SimpleNamespace:
        device = self._device(handle)
        if version is None:
            return SimpleNamespace(**device["memory_v1"])
        if device.get("memory_v2") is None:
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        return SimpleNamespace(**device["memory_v2"])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        return [SimpleNamespace(**p) for p in self._device(handle)["nvmlDeviceGetComputeRunningProcesses"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        return [SimpleNamespace(**p) for p in self._device(handle)["nvmlDeviceGetGraphicsRunningProcesses"]]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check()
        name = self.recording["process_names"].get(str(pid))
        if not isinstance(name, str):
            raise FakeNVMLError(NVML_ERROR_NO_PERMISSION, "Insufficient Permissions")
        return name
