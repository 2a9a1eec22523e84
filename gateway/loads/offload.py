"""A load that can't fit the GPU: loaded partly on the CPU, made to wait, or refused (``residency.when_gpu_full``).

    when_gpu_full   a load ``decide_load`` refused (nothing that ends would make room on the GPU)
    offload         loaded partly on the CPU, as the backend itself would: when it does (``CpuOffload``), the
    (default)       models in the way can be unloaded (Ollama offloads only a model loaded alone: idle ones are
                    unloaded first, busy ones waited for, pinned ones keep it refused), the backend runs on this
                    host and ``/proc/meminfo`` says its system RAM holds the layers that stay on the CPU (weights
                    and KV, ``memory.estimate.offload``) without swapping; otherwise refused, saying why
    wait            waits ``residency.load_wait_s`` for GPU memory (a foreign process may end), then 503
    refuse          503 at once, as before

Whether a backend offloads (``CpuOffload``): its ``cpu_offload`` setting; on "auto", what kvgate saw (``/api/ps``
listing a model with ``size_vram`` < ``size``: it does; a load kvgate let spill that failed: it does not), else
its version: Ollama 0.30+ runs llama.cpp's llama-server, whose fit (``LLAMA_ARG_FIT``) is on by default; an older
Ollama, or one whose version can't be read, is not assumed to. A spilled load that failed is not tried again even
on "on" (the backend has shown it can't); "off" is never overruled. No I/O but the one read of ``meminfo_path``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from ipaddress import ip_address
from pathlib import Path

from yarl import URL

from gateway.backends import Backend
from gateway.loads.plan import GpuRoom, LoadAction, LoadAsk, LoadDecision, ResidentState, unload_candidates
from gateway.memory.fit_estimate import VramRoom, estimate
from gateway.memory.host_ram import RamVerdict, ram_check, read_host_ram
from gateway.memory.load_cost import RunKnobs
from gateway.memory.profile import ModelProfile

FIT_SINCE_VERSION = (0, 30, 0)
"""Ollama v0.30.0 runs llama-server for every model (ollama.md: E3), with llama.cpp's fit on by default."""


class CpuOffload:
    """Whether each backend loads a model too big for its GPU partly on the CPU (see the module docstring)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[bool, str]] = {}

    def saw(self, backend: str, offloads: bool, why: str) -> None:
        """What a backend was seen doing (a model partly on the CPU, or a spilled load that failed)."""
        self._seen[backend] = (offloads, why)

    def verdict(self, backend: Backend, version: str | None) -> tuple[bool, str]:
        """(whether it offloads, why kvgate thinks so)."""
        setting = backend.settings.cpu_offload
        seen = self._seen.get(backend.name)
        if setting == "off" or (setting == "on" and (seen is None or seen[0])):
            return setting == "on", f"cpu_offload = '{setting}'"
        if seen is not None:  # on "auto"; or on "on", a spilled load that failed: not tried again
            return seen
        parsed = _version(version)
        if parsed is None:
            return False, (f"Ollama's version can't be read ({version or 'no /api/version'}); set cpu_offload = "
                           "'on' if it fits models partly on the CPU")
        if parsed >= FIT_SINCE_VERSION:
            return True, f"Ollama {version} fits a model partly on the CPU by default (llama.cpp's fit)"
        return False, (f"Ollama {version} is older than 0.30 (kvgate assumes no CPU offload; set cpu_offload = "
                       "'on' if it does)")


def _version(text: str | None) -> tuple[int, int, int] | None:
    if not text:
        return None
    parts = text.strip().lstrip("v").split("-")[0].split(".")
    try:
        numbers = [int(part) for part in parts[:3]]
    except ValueError:
        return None
    major, minor, patch = (*numbers, 0, 0, 0)[:3]
    return major, minor, patch


@dataclass(frozen=True, slots=True)
class FullGpu:
    """A load ``decide_load`` refused, and what the GPU holds when it did."""

    refused: LoadDecision
    ask: LoadAsk
    residents: Sequence[ResidentState]
    room: GpuRoom
    """Its ``available_bytes`` count the model's own resident copy as free (it is replaced by the load)."""
    now_s: float
    min_resident_s: float


@dataclass(frozen=True, slots=True)
class SpillTarget:
    """Where a load would spill to the CPU: the backend's host, the model, and the host's /proc/meminfo."""

    backend: Backend
    profile: ModelProfile
    meminfo_path: Path


def when_full(mode: str, full: FullGpu, cpu: tuple[bool, str], target: SpillTarget) -> LoadDecision:
    """What a load ``decide_load`` refused becomes under ``when_gpu_full = mode`` (module docstring)."""
    refused, residents, ask = full.refused, full.residents, full.ask
    if mode == "wait":
        return replace(refused, action=LoadAction.WAIT, reason=f"{refused.reason}; it waits for GPU memory to be "
                       "freed (residency.when_gpu_full = 'wait')")
    if mode != "offload":
        return replace(refused, reason=f"{refused.reason} (residency.when_gpu_full = 'refuse')")
    offloads, why = cpu
    if not offloads:
        return replace(refused, reason=f"{refused.reason}; not loaded partly on the CPU: {why}")
    now_free, later = unload_candidates(residents, ask, full.now_s, full.min_resident_s)
    stuck = [m.name for m in residents if m.name not in {r.name for r in (*now_free, *later)}]
    if stuck:
        return replace(refused, reason=f"{refused.reason}; the backend loads a model partly on the CPU only with no "
                       f"other model loaded, and {', '.join(stuck)} may not be unloaded (pinned, or of a higher "
                       "priority)")
    if later:
        return replace(refused, action=LoadAction.WAIT, reason=f"it loads partly on the CPU once "
                       f"{', '.join(m.name for m in later)} can be unloaded (the backend offloads only a model loaded "
                       "alone)")
    freed = sum(m.resident_bytes for m in now_free)
    room = full.room
    vram_free = max(0, min(room.available_bytes + freed, room.total_bytes) - room.headroom_bytes)
    unloading = replace(refused, unload=tuple(m.name for m in now_free), freed_bytes=freed)
    return offloaded(target, unloading, vram_free, room.total_bytes)


def offloaded(target: SpillTarget, refused: LoadDecision, vram_free_bytes: int, vram_total_bytes: int,
              ) -> LoadDecision:  # fmt: skip
    """A refused load (with the models it would unload first), allowed to run partly on the CPU when the backend's
    host is this one and its system RAM holds the offloaded layers without swapping; refused otherwise, saying why
    (and then unloading nothing)."""
    backend, profile, meminfo_path = target.backend, target.profile, target.meminfo_path
    unload, freed = refused.unload, refused.freed_bytes
    refused = replace(refused, unload=(), freed_bytes=0)
    if not is_local(backend):
        return replace(refused, reason=f"{refused.reason}; it would need CPU offload, and the system RAM of "
                       f"{backend.settings.shown_url} can't be read from here (kvgate reads its own /proc/meminfo)")
    settings = backend.settings
    result = estimate(
        profile,
        context=refused.context_tokens,
        parallel=settings.parallel or 1,
        knobs=RunKnobs(type_k=settings.cache_type_k, type_v=settings.cache_type_v),
        vram=VramRoom(total_bytes=vram_total_bytes, free_bytes=vram_free_bytes),
    )
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
        cpu_layers=spill.cpu_layers, n_layers=spill.n_layers,
        reason=f"{spill.cpu_layers} of {spill.n_layers} layers on the CPU, {spill.ram_bytes:,} bytes of system "
        f"RAM ({check.host.available_bytes:,} available; residency.when_gpu_full = 'offload')",
    )


class Offloads:
    """The models kvgate let load partly on the CPU, per (backend, model), for X-Kvgate-Offload."""

    def __init__(self) -> None:
        self._decisions: dict[tuple[str, str], LoadDecision] = {}

    def after_load(self, backend: str, model: str, decision: LoadDecision) -> None:
        if decision.offloaded_ram_bytes:
            self._decisions[(backend, model)] = decision
        else:
            self._decisions.pop((backend, model), None)

    def said(self, backend: str, model: str, share: float | None) -> str | None:
        """The header: the layers kvgate let spill, or the share of the model on the CPU the last /api/ps showed
        (``share``: one the backend offloaded by itself); None while it runs on the GPU alone."""
        if share is not None and share <= 0:
            self._decisions.pop((backend, model), None)  # reloaded on the GPU alone since
            return None
        decision = self._decisions.get((backend, model))
        if decision is not None:
            return (f"{decision.cpu_layers} of {decision.n_layers} layers on the CPU (system RAM "
                    f"{decision.offloaded_ram_bytes / 2**30:.1f} GiB)")
        return None if share is None else f"{share:.0%} of the model on the CPU (Ollama's /api/ps)"


def is_local(backend: Backend) -> bool:
    """Whether the backend runs on this host (a loopback address), so its system RAM is the one kvgate reads."""
    host = URL(backend.settings.url).host or ""
    if host == "localhost":
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
