"""The virtual GPU as a ``gateway.memory.vram.VramSource``: in-process, or over HTTP (``GET /sim/gpu``).

A gateway in front of the simulator sees VRAM change as models load, reload and unload and as foreign processes
come and go, exactly as it would through NVML.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from gateway.memory.vram import DeviceMemory, ProcessMemory, VramReading, VramUnavailable
from kvsim.admin_routes import snapshot_json
from kvsim.state import SIM_STATE
from kvsim.vgpu import VirtualGpu


def reading_from_json(body: dict[str, Any], taken_at_s: float) -> VramReading:
    """A ``VramReading`` from ``GET /sim/gpu``'s body."""
    try:
        devices = tuple(
            DeviceMemory(
                index=d["index"],
                name=d["name"],
                uuid=f"SIM-GPU-{d['index']}",
                total_bytes=d["total_bytes"],
                used_bytes=d["used_bytes"],
                free_bytes=d["free_bytes"],
            )
            for d in body["devices"]
        )
        processes = tuple(
            ProcessMemory(pid=p["pid"], device_index=p["device"], used_bytes=p["used_bytes"], name=p["name"])
            for p in body["processes"]
        )
    except (KeyError, TypeError) as exc:
        raise VramUnavailable(f"the simulator's /sim/gpu answer is missing {exc}") from exc
    return VramReading(devices=devices, processes=processes, taken_at_s=taken_at_s, source="sim")


class SimVramSource:
    """Reads a virtual GPU in the same process (the demo, tests)."""

    name = "sim"

    def __init__(self, vgpu: VirtualGpu, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._vgpu = vgpu
        self._clock = clock

    async def read(self) -> VramReading:
        now = self._clock()
        return reading_from_json(snapshot_json(self._vgpu.snapshot(), now), now)


class HttpSimVramSource:
    """Reads a simulator's GPU over HTTP; the session is the caller's (it owns its lifetime)."""

    name = "sim"

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 5.0,
    ) -> None:
        self._session = session
        self._url = base_url.rstrip("/") + "/sim/gpu"
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def read(self) -> VramReading:
        try:
            async with self._session.get(self._url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise VramUnavailable(f"{self._url} answered {resp.status}")
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise VramUnavailable(f"cannot read {self._url}: {exc}") from exc
        return reading_from_json(body, self._clock())


def vram_source_of(runner: web.AppRunner, *, clock: Callable[[], float] = time.monotonic) -> SimVramSource:
    """The in-process VRAM source of a simulator started with ``start_sim``."""
    return SimVramSource(runner.app[SIM_STATE].vgpu, clock=clock)
