"""A load's system RAM: what a partly offloaded load puts there, what the host has (``/proc/meminfo``), the verdict.

A model that spills to the CPU keeps its offloaded layers (and their KV) in system RAM; when that is more than the
host has, the load pushes it into swap or gets the backend ``Killed`` by the OOM killer (troubleshooting.md: "the
process is `Killed` with no CUDA error"). ``ram_verdict`` compares a RAM cost with ``MemAvailable``:

    fits        ram <= available - headroom
    would_swap  available - headroom < ram <= available + swap free
    would_oom   ram > available + swap free                (the kernel's OOM killer ends the backend)

``offload`` sizes what spills from an ``Estimate`` (fit_estimate.py) that does not fit VRAM, and ``ram_check`` judges
it against the host. Pure, but for the one small reader of ``/proc/meminfo``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # offload reads an Estimate's numbers; fit_estimate does not import this module
    from gateway.memory.fit_estimate import Estimate

MEMINFO_PATH = Path("/proc/meminfo")
KIB = 1024
DEFAULT_RAM_HEADROOM_BYTES = 1 << 30  # left free for the OS, kvgate itself and the page cache (configurable later)
_FIELDS = {
    "MemTotal": "total_bytes",
    "MemAvailable": "available_bytes",
    "SwapTotal": "swap_total_bytes",
    "SwapFree": "swap_free_bytes",
}


class HostRamUnavailable(Exception):
    """``/proc/meminfo`` cannot be read or lacks a field (not Linux, a restricted container)."""


@dataclass(frozen=True)
class HostRam:
    total_bytes: int
    available_bytes: int  # MemAvailable: what can be allocated without swapping
    swap_total_bytes: int
    swap_free_bytes: int


class RamVerdict(StrEnum):
    FITS = "fits"
    WOULD_SWAP = "would_swap"
    WOULD_OOM = "would_oom"


def parse_meminfo(text: str, *, source: str = str(MEMINFO_PATH)) -> HostRam:
    """``/proc/meminfo`` text (``Name:   value kB`` lines) -> HostRam in bytes; HostRamUnavailable names a missing
    or malformed field."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or name.strip() not in _FIELDS:
            continue
        parts = rest.split()
        if not parts or not parts[0].isdigit() or (len(parts) > 1 and parts[1] != "kB"):
            raise HostRamUnavailable(f"{source}: cannot read {name.strip()} from {line.strip()!r}")
        values[_FIELDS[name.strip()]] = int(parts[0]) * (KIB if len(parts) > 1 else 1)
    missing = [name for name, attr in _FIELDS.items() if attr not in values]
    if missing:
        raise HostRamUnavailable(f"{source}: no {', '.join(missing)} (MemAvailable needs Linux 3.14+)")
    return HostRam(**values)


def read_host_ram(path: Path | str = MEMINFO_PATH) -> HostRam:
    """Read and parse ``path`` (default ``/proc/meminfo``); HostRamUnavailable when it cannot be read (not Linux)."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        reason = exc.strerror or exc
        raise HostRamUnavailable(f"cannot read {path}: {reason} (system RAM is read on Linux only)") from None
    return parse_meminfo(text, source=str(path))


def ram_verdict(ram_bytes: int, host: HostRam, *, headroom_bytes: int = DEFAULT_RAM_HEADROOM_BYTES) -> RamVerdict:
    """Whether ``ram_bytes`` more in system RAM fit ``host`` (see the module docstring; boundaries are inclusive)."""
    if ram_bytes < 0:
        raise ValueError(f"RAM cost is {ram_bytes} bytes; must be >= 0")
    if ram_bytes == 0 or ram_bytes <= host.available_bytes - headroom_bytes:
        return RamVerdict.FITS
    if ram_bytes <= host.available_bytes + host.swap_free_bytes:
        return RamVerdict.WOULD_SWAP
    return RamVerdict.WOULD_OOM


FIT_TARGET_BYTES = 1024 << 20  # llama.cpp --fit leaves this much free per device (-fitt, default 1024 MiB)


@dataclass(frozen=True)
class Offload:
    """How a load that does not fit VRAM splits between GPU and CPU (``offload``)."""

    n_layers: int
    gpu_layers: int
    ram_bytes: int  # system RAM the CPU-side layers take: their weights and their KV

    @property
    def cpu_layers(self) -> int:
        return self.n_layers - self.gpu_layers

    @property
    def offloaded(self) -> bool:
        return self.ram_bytes > 0


def offload(
    result: Estimate, *, fit_target_bytes: int = FIT_TARGET_BYTES, cpu_overhead_bytes: int = 0
) -> Offload | None:
    """System RAM a partly offloaded load takes; None without a VRAM reading (no way to say what spills).

    Nothing is offloaded when ``result.fits``. Otherwise the backend (llama.cpp ``--fit``, on by default and what
    Ollama v0.30+ relies on) keeps as many whole layers on the GPU as fit in ``available - fit_target - (compute +
    output + overhead)`` and runs the rest on the CPU; llama.cpp puts the KV of a CPU layer in system RAM too. So

        per_layer  = (weights + KV) / n_layers
        gpu_layers = floor(gpu_budget / per_layer), 0..n_layers
        ram        = cpu_layers * per_layer + cpu_overhead_bytes

    Assumptions (the facts give no per-layer split and no CPU-side constant): weights and KV are spread evenly over
    the layers (the token embeddings, which llama.cpp keeps on the CPU anyway, and SWA layers' smaller KV are
    averaged in); the compute, output and configured overhead stay on the GPU; ``cpu_overhead_bytes`` (default 0)
    stands for the CPU compute buffer a partial offload adds, which has no closed form. Offloaded weights are
    mmap'ed file pages, reclaimable in principle, but counted as resident: evicting them re-reads the file every
    token. llama-server's host-RAM prompt cache (``-cram``, 8 GiB by default) fills lazily and is not counted.
    """
    available = result.available_bytes
    if available is None:
        return None
    cost = result.cost
    n_layers = max(1, result.n_layers)
    if result.fits:
        return Offload(n_layers=n_layers, gpu_layers=n_layers, ram_bytes=0)
    layered = cost.weights_bytes + cost.kv_bytes
    gpu_budget = available - fit_target_bytes - (cost.compute_bytes + cost.output_bytes + cost.overhead_bytes)
    per_layer = layered / n_layers
    gpu_layers = 0 if per_layer <= 0 else min(n_layers, max(0, int(gpu_budget // per_layer)))
    cpu_layers = n_layers - gpu_layers
    ram = round(layered * cpu_layers / n_layers) + (cpu_overhead_bytes if cpu_layers else 0)
    return Offload(n_layers=n_layers, gpu_layers=gpu_layers, ram_bytes=ram)



RAM_NOTE = ("system RAM of the kvgate host (/proc/meminfo): the backend is assumed to run on the same host")


@dataclass(frozen=True)
class RamCheck:
    """A load's system-RAM cost against the host's available memory (``ram_check``)."""

    offload: Offload | None
    host: HostRam | None
    verdict: RamVerdict | None
    note: str

    @property
    def ram_bytes(self) -> int | None:
        return self.offload.ram_bytes if self.offload else None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ram_bytes": self.ram_bytes}
        if self.offload is None or self.offload.offloaded:
            body.update({
                "ram_available_bytes": self.host.available_bytes if self.host else None,
                "ram_swap_free_bytes": self.host.swap_free_bytes if self.host else None,
                "ram_verdict": self.verdict.value if self.verdict else None,
                "ram_note": self.note,
            })
        if self.offload is not None and self.offload.offloaded:
            body["gpu_layers"], body["cpu_layers"] = self.offload.gpu_layers, self.offload.cpu_layers
        return body

    def warning(self) -> str | None:
        if self.verdict is RamVerdict.WOULD_OOM:
            return "the offloaded layers need more system RAM than is available plus free swap: the OOM killer " \
                   "would end the backend"
        if self.verdict is RamVerdict.WOULD_SWAP:
            return "the offloaded layers would push the host into swap"
        return None


def ram_check(
    result: Estimate, read_host: Callable[[], HostRam], *, headroom_bytes: int = DEFAULT_RAM_HEADROOM_BYTES,
    cpu_overhead_bytes: int = 0,
) -> RamCheck:
    """``offload`` of ``result`` judged against ``read_host()`` (a HostRam, or HostRamUnavailable), read only when
    something spills."""
    spill = offload(result, cpu_overhead_bytes=cpu_overhead_bytes)
    if spill is None:
        return RamCheck(None, None, None, "no VRAM reading: cannot say what would be offloaded")
    if not spill.offloaded:
        return RamCheck(spill, None, RamVerdict.FITS, RAM_NOTE)
    try:
        host: HostRam = read_host()
    except HostRamUnavailable as exc:
        return RamCheck(spill, None, None, f"{RAM_NOTE}; unreadable: {exc}")
    return RamCheck(spill, host, ram_verdict(spill.ram_bytes, host, headroom_bytes=headroom_bytes), RAM_NOTE)
