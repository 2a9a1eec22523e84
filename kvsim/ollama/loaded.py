"""One loaded model: its simulated llama-server process, what it holds on the GPU, who is using it.

A runner's lifetime mirrors Ollama's ``runnerRef``: ``ref_count`` counts the requests holding it; when it drops
to zero a keep-alive timer starts (or the runner unloads at once if its session duration is 0, which is how an
expired runner waits for its in-flight requests). ``slots`` is the per-runner ``semaphore.Weighted(num_parallel)``
that makes requests beyond num_parallel wait without bound.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from kvsim.catalog import ModelSpec
from kvsim.failures import SimError
from kvsim.gpu.load_cost import LoadCost, Offload
from kvsim.ollama.options import LoadedState


@dataclass(eq=False)
class LoadedRunner:
    spec: ModelSpec
    pid: int
    state: LoadedState
    cost: LoadCost  # what it holds on the GPU
    placement: dict[int, int]  # bytes per device
    num_parallel: int
    num_ctx: int  # per sequence, after clamping: /api/ps context_length
    slot_ctx: int  # the llama-server slot's cells (num_ctx padded to 256)
    session_s: float
    loaded_at_s: float
    ref_count: int = 0
    expires_at: datetime | None = None
    error: SimError | None = None  # the load failed or was aborted
    crashed: bool = False  # the process died (runtime out of memory)
    unloaded: bool = False
    dynamic_bytes: int = 0  # dynamic-KV mode: KV grown so far
    offload: Offload | None = None  # llama.cpp's fit kept some layers on the CPU
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    timer: asyncio.Task[None] | None = None
    slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.num_parallel)

    @property
    def main_device(self) -> int:
        return max(self.placement, key=lambda d: (self.placement[d], -d))

    @property
    def vram_bytes(self) -> int:
        """/api/ps ``size_vram``: the GPU buffers."""
        return self.cost.total_bytes + self.dynamic_bytes

    @property
    def host_bytes(self) -> int:
        """System memory /api/ps counts (``size`` - ``size_vram``): 0 unless partly offloaded."""
        return self.offload.host_bytes if self.offload is not None else 0

    @property
    def size_bytes(self) -> int:
        """/api/ps ``size``: every buffer; equal to ``vram_bytes`` when every layer is on the GPU."""
        return self.vram_bytes + self.host_bytes

    @property
    def usable(self) -> bool:
        return not (self.crashed or self.unloaded or self.error is not None)

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
