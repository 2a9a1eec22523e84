"""Everything one simulator instance holds, reachable from its routes through a typed app key."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.sim.catalog import ModelSpec
from gateway.sim.clock import Clock
from gateway.sim.config import SimConfig
from gateway.sim.llama_engine import LlamaServerEngine
from gateway.sim.ollama_service import OllamaService
from gateway.sim.scheduler import OllamaScheduler
from gateway.sim.stats import SimStats
from gateway.sim.vgpu import VirtualGpu


@dataclass
class SimState:
    config: SimConfig
    models: dict[str, ModelSpec]
    vgpu: VirtualGpu
    clock: Clock
    stats: SimStats
    scheduler: OllamaScheduler | None = None
    service: OllamaService | None = None
    engine: LlamaServerEngine | None = None

    @property
    def ollama(self) -> OllamaService:
        assert self.service is not None, "an Ollama route on a llama-server-mode simulator"
        return self.service

    @property
    def llama(self) -> LlamaServerEngine:
        assert self.engine is not None, "a llama-server route on an Ollama-mode simulator"
        return self.engine


SIM_STATE = web.AppKey("sim_state", SimState)
