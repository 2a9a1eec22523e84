"""System RAM of the kvgate host, from ``/proc/meminfo``, and a verdict on a load's RAM cost (pure + tiny reader).

A model that spills to the CPU keeps its offloaded layers (and their KV) in system RAM; when that is more than the
host has, the load pushes it into swap or gets the backend ``Killed`` by the OOM killer (troubleshooting.md: "the
process is `Killed` with no CUDA error"). ``ram_verdict`` compares a RAM cost with ``MemAvailable``:

    fits        ram <= available - headroom
    would_swap  available - headroom < ram <= available + swap free
    would_oom   ram > available + swap free                (the kernel's OOM killer ends the backend)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

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
