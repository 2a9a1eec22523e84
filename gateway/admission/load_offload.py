"""A load refused for lack of GPU memory, tried partly on the CPU (``residency.allow_cpu_offload``; loads.py).

Allowed only when the backend runs on this host (a loopback address: its system RAM is the one kvgate reads) and
``/proc/meminfo`` says the layers that stay on the CPU (weights and KV, ``memory.estimate.offload``) fit without
swapping; refused otherwise, saying why. No I/O but the one read of ``meminfo_path``.
"""

from __future__ import annotations

from dataclasses import replace
from ipaddress import ip_address
from pathlib import Path

from yarl import URL

from gateway.admission.load_plan import LoadAction, LoadDecision
from gateway.backends import Backend
from gateway.memory.estimate import estimate, ram_check
from gateway.memory.host_ram import RamVerdict, read_host_ram
from gateway.memory.profile import ModelProfile


def offloaded(
    backend: Backend, profile: ModelProfile, refused: LoadDecision, unload: tuple[str, ...], freed: int,
    vram_free_bytes: int, vram_total_bytes: int, meminfo_path: Path,
) -> LoadDecision:
    """A refused load, allowed to run partly on the CPU when the backend's host is this one and its system RAM holds
    the offloaded layers without swapping; refused otherwise, saying why."""
    if not is_local(backend):
        return replace(refused, reason=f"{refused.reason}; it would need CPU offload, and the system RAM of "
                       f"{backend.settings.url} can't be read from here (kvgate reads its own /proc/meminfo)")
    settings = backend.settings
    result = estimate(profile, context=refused.context_tokens, parallel=settings.parallel or 1,
                      type_k=settings.cache_type_k, type_v=settings.cache_type_v,
                      vram_total_bytes=vram_total_bytes, vram_free_bytes=vram_free_bytes)
    check = ram_check(result, lambda: read_host_ram(meminfo_path))
    spill = check.offload
    if check.verdict is not RamVerdict.FITS or spill is None or check.host is None:
        why = check.warning() or check.note
        ram = f"{spill.ram_bytes:,} bytes of system RAM" if spill else "system RAM"
        available = f", {check.host.available_bytes:,} available" if check.host else ""
        return replace(refused, reason=f"{refused.reason}; loaded partly on the CPU it would take {ram}"
                       f"{available}: {why}")
    return replace(
        refused, action=LoadAction.LOAD, unload=unload, freed_bytes=freed, offloaded_ram_bytes=spill.ram_bytes,
        reason=f"{spill.cpu_layers} of {spill.n_layers} layers on the CPU, {spill.ram_bytes:,} bytes of system "
        f"RAM ({check.host.available_bytes:,} available; residency.allow_cpu_offload)",
    )


def is_local(backend: Backend) -> bool:
    """Whether the backend runs on this host (a loopback address), so its system RAM is the one kvgate reads."""
    host = URL(backend.settings.url).host or ""
    if host == "localhost":
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
