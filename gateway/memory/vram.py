"""Live VRAM behind one interface.

    VramSource.read() -> VramReading        one async method; raises VramUnavailable when it cannot read
      NvmlSource        (vram_nvml)         the local driver through pynvml; per-process usage with names
      ExporterSource    (backends/          a Prometheus exporter URL (dcgm-exporter, nvidia_gpu_exporter), read
                         vram_exporter)      with the backends' HTTP client
      StaticVramSource  (here)              a configured size such as "24GiB"
      CachedVramSource  (here)              re-reads at most every refresh_s; readings carry their age

Times are seconds from an injected monotonic clock, so tests control age and refresh.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

Clock = Callable[[], float]


class VramUnavailable(Exception):
    """Raised when a VRAM source cannot produce a reading (no driver, exporter down, bad answer)."""


@dataclass(frozen=True)
class DeviceMemory:
    index: int
    name: str
    uuid: str
    total_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    device_index: int
    used_bytes: int | None  # None when the driver does not say (no permission, some vGPU setups)
    name: str | None


@dataclass(frozen=True)
class VramReading:
    devices: tuple[DeviceMemory, ...]
    processes: tuple[ProcessMemory, ...]
    taken_at_s: float
    source: str

    @property
    def total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices)

    @property
    def used_bytes(self) -> int:
        return sum(d.used_bytes for d in self.devices)

    @property
    def free_bytes(self) -> int:
        return sum(d.free_bytes for d in self.devices)

    def age_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.taken_at_s)

    def device(self, index: int) -> DeviceMemory:
        for device in self.devices:
            if device.index == index:
                return device
        raise KeyError(f"no GPU {index} in this reading (have {[d.index for d in self.devices]})")


class VramSource(Protocol):
    name: str

    async def read(self) -> VramReading: ...


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
SIZE_FORMS = "a number of bytes, or a number with KiB/MiB/GiB/TiB (or K/M/G/T, binary) or KB/MB/GB/TB (decimal)"


def parse_size(text: str) -> int:
    """Bytes in '24GiB', '24 GB', '512M', '80000000000'; ValueError naming the accepted forms."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"cannot read {text!r} as a size; expected {SIZE_FORMS}, e.g. 24GiB")
    number, unit = match.groups()
    unit = (unit or "").lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown size unit in {text!r}; expected {SIZE_FORMS}")
    size = round(float(number) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"size {text!r} must be greater than zero; expected {SIZE_FORMS}, e.g. 24GiB")
    return size


class StaticVramSource:
    """One device of a configured size; ``used_bytes`` lets a config reserve room for other processes."""

    name = "static"

    def __init__(self, total_bytes: int, *, used_bytes: int = 0, clock: Clock = time.monotonic) -> None:
        if total_bytes <= 0 or not 0 <= used_bytes <= total_bytes:
            raise ValueError(f"static VRAM needs 0 <= used ({used_bytes}) <= total ({total_bytes}) and total > 0")
        self._device = DeviceMemory(0, "static", "", total_bytes, used_bytes, total_bytes - used_bytes)
        self._clock = clock

    @classmethod
    def from_text(cls, size: str, *, clock: Clock = time.monotonic) -> StaticVramSource:
        return cls(parse_size(size), clock=clock)

    async def read(self) -> VramReading:
        return VramReading(devices=(self._device,), processes=(), taken_at_s=self._clock(), source=self.name)


class CachedVramSource:
    """Serves the last reading until it is ``refresh_s`` old; concurrent callers share one refresh."""

    def __init__(self, inner: VramSource, *, refresh_s: float, clock: Clock = time.monotonic) -> None:
        if refresh_s < 0:
            raise ValueError(f"refresh period is {refresh_s} s; must be >= 0")
        self.name = inner.name
        self._inner = inner
        self._refresh_s = refresh_s
        self._clock = clock
        self._last: VramReading | None = None
        self._lock = asyncio.Lock()

    @property
    def last(self) -> VramReading | None:
        return self._last

    async def read(self, *, taken_after_s: float | None = None) -> VramReading:
        """The last reading while it is fresh; with ``taken_after_s``, only one taken at or after that time (a reading
        that shows what an unload gave back)."""
        async with self._lock:
            last = self._last
            fresh = last is not None and last.age_s(self._clock()) < self._refresh_s
            if last is not None and fresh and (taken_after_s is None or last.taken_at_s >= taken_after_s):
                return last
            self._last = await self._inner.read()
            return self._last
