"""Everything one simulator instance holds, reachable from its routes through a typed app key."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from kvsim.catalog import ModelSpec
from kvsim.clock import Clock
from kvsim.config import SimConfig
from kvsim.gpu.vgpu import VirtualGpu
from kvsim.llama_server.llama_engine import LlamaServerEngine
from kvsim.ollama.ollama_service import OllamaService
from kvsim.ollama.scheduler import OllamaScheduler
from kvsim.stats import SimStats


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
