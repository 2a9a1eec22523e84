"""A virtual multi-GPU: devices of a fixed size, processes that hold bytes on them.

    device 0  | runner A (weights+KV+compute) | runner B | foreign proc | free ............ |  total
    device 1  | runner A (its share of layers) |                           free ........... |  total

Runner processes allocate with ``try_allocate`` (all-or-nothing across devices, refused when a device lacks
the bytes, as cudaMalloc is). Foreign processes are added with ``add_foreign``, which always succeeds: it
models memory taken behind the server's back, so a device can end up oversubscribed (used > total), and a
runner that then needs memory at run time fails. Every change bumps ``version``. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class DeviceSpec:
    index: int
    total_bytes: int
    name: str = "Simulated GPU"


@dataclass
class GpuProcess:
    pid: int
    name: str
    foreign: bool
    bytes_by_device: dict[int, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_device.values())


@dataclass(frozen=True)
class DeviceUsage:
    index: int
    name: str
    total_bytes: int
    used_bytes: int

    @property
    def free_bytes(self) -> int:
        return max(self.total_bytes - self.used_bytes, 0)


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    name: str
    device: int
    used_bytes: int
    foreign: bool


@dataclass(frozen=True)
class GpuSnapshot:
    devices: tuple[DeviceUsage, ...]
    processes: tuple[ProcessUsage, ...]
    version: int


@dataclass(frozen=True)
class AllocationFailure:
    """The first device that could not hold its share (for the out-of-memory message)."""

    device: int
    requested_bytes: int
    free_bytes: int


class VirtualGpu:
    def __init__(self, devices: Sequence[DeviceSpec], *, first_pid: int = 4100) -> None:
        if not devices:
            raise ValueError("a virtual GPU needs at least one device")
        self.devices = {d.index: d for d in devices}
        self._procs: dict[int, GpuProcess] = {}
        self._next_pid = first_pid
        self.version = 0

    def used_bytes(self, device: int) -> int:
        return sum(p.bytes_by_device.get(device, 0) for p in self._procs.values())

    def free_bytes(self, device: int) -> int:
        """Free bytes; negative when the device is oversubscribed."""
        return self.devices[device].total_bytes - self.used_bytes(device)

    def oversubscribed(self, device: int) -> bool:
        return self.free_bytes(device) < 0

    def spawn(self, name: str, *, foreign: bool = False) -> int:
        pid = self._next_pid
        self._next_pid += 1
        self._procs[pid] = GpuProcess(pid=pid, name=name, foreign=foreign)
        self.version += 1
        return pid

    def process(self, pid: int) -> GpuProcess | None:
        return self._procs.get(pid)

    def try_allocate(self, pid: int, bytes_by_device: Mapping[int, int]) -> AllocationFailure | None:
        """Allocate on every device or on none; None on success."""
        for device, nbytes in bytes_by_device.items():
            free = self.free_bytes(device)
            if nbytes > free:
                return AllocationFailure(device=device, requested_bytes=nbytes, free_bytes=max(free, 0))
        self._add(pid, bytes_by_device)
        return None

    def try_allocate_buffers(self, pid: int, parts: Sequence[Mapping[int, int]]) -> AllocationFailure | None:
        """Allocate buffer after buffer, as a runtime does; on a failure free what was taken and say which."""
        taken: list[Mapping[int, int]] = []
        for part in parts:
            failure = self.try_allocate(pid, part)
            if failure is not None:
                for done in taken:
                    self.release(pid, done)
                return failure
            taken.append(part)
        return None

    def add_foreign(self, name: str, device: int, nbytes: int) -> int:
        if device not in self.devices:
            raise KeyError(f"no device {device}; devices: {sorted(self.devices)}")
        pid = self.spawn(name, foreign=True)
        self._add(pid, {device: nbytes})
        return pid

    def release(self, pid: int, bytes_by_device: Mapping[int, int]) -> None:
        proc = self._procs[pid]
        for device, nbytes in bytes_by_device.items():
            left = proc.bytes_by_device.get(device, 0) - nbytes
            if left > 0:
                proc.bytes_by_device[device] = left
            else:
                proc.bytes_by_device.pop(device, None)
        self.version += 1

    def kill(self, pid: int) -> bool:
        """End a process, freeing all it holds; False when there was none."""
        found = self._procs.pop(pid, None) is not None
        if found:
            self.version += 1
        return found

    def _add(self, pid: int, bytes_by_device: Mapping[int, int]) -> None:
        proc = self._procs[pid]
        for device, nbytes in bytes_by_device.items():
            if nbytes:
                proc.bytes_by_device[device] = proc.bytes_by_device.get(device, 0) + nbytes
        self.version += 1

    def snapshot(self) -> GpuSnapshot:
        devices = tuple(
            DeviceUsage(index=d.index, name=d.name, total_bytes=d.total_bytes, used_bytes=self.used_bytes(i))
            for i, d in sorted(self.devices.items())
        )
        processes = tuple(
            ProcessUsage(pid=p.pid, name=p.name, device=dev, used_bytes=nbytes, foreign=p.foreign)
            for p in self._procs.values()
            for dev, nbytes in sorted(p.bytes_by_device.items())
        )
        return GpuSnapshot(devices=devices, processes=processes, version=self.version)
