"""The simulator as an aiohttp application: Ollama's API or llama-server's, plus the /sim admin routes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from kvsim.admin_routes import add_admin_routes
from kvsim.catalog import select
from kvsim.clock import Clock, ScaledClock
from kvsim.config import SimConfig
from kvsim.gpu.vgpu import DeviceSpec, VirtualGpu
from kvsim.llama_server import llama_embeddings, llama_info, llama_routes
from kvsim.llama_server.llama_engine import LlamaServerEngine
from kvsim.ollama import ollama_models, ollama_routes
from kvsim.ollama.compat import anthropic_routes, openai_routes, responses_routes
from kvsim.ollama.host_check import ollama_edge
from kvsim.ollama.ollama_service import OllamaService
from kvsim.ollama.scheduler import OllamaScheduler
from kvsim.state import SIM_STATE, SimState
from kvsim.stats import SimStats


def build_state(config: SimConfig, *, clock: Clock | None = None) -> SimState:
    vgpu = VirtualGpu([DeviceSpec(i, size, f"Simulated GPU {i}") for i, size in enumerate(config.gpu_bytes)])
    models = select(config.models if config.mode == "ollama" else (config.server_model,))
    return SimState(
        config=config, models=models, vgpu=vgpu, clock=clock or ScaledClock(config.time_scale), stats=SimStats()
    )


def create_sim_app(config: SimConfig, *, clock: Clock | None = None) -> web.Application:
    """An app for ``config``; tokenizers are converted and the scheduler started at app start-up."""
    state = build_state(config, clock=clock)
    middlewares = [llama_info.not_found] if config.mode == "llama-server" else [ollama_edge]
    app = web.Application(middlewares=middlewares)
    app[SIM_STATE] = state
    app.cleanup_ctx.append(_lifecycle)
    add_admin_routes(app)
    if config.mode == "ollama":
        _ollama_routes(app)
    else:
        _llama_routes(app)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[SIM_STATE]
    if state.config.mode == "ollama":
        scheduler = OllamaScheduler(state.config, state.vgpu, state.clock, state.stats)
        state.scheduler = scheduler
        state.service = OllamaService(state.config, state.models, state.vgpu, state.clock, state.stats, scheduler)
        await state.service.warm_up()
        scheduler.start()
    else:
        spec = next(iter(state.models.values()))
        state.engine = LlamaServerEngine(state.config, spec, state.vgpu, state.clock, state.stats)
    yield
    if state.scheduler is not None:
        await state.scheduler.close()
    if state.engine is not None:
        state.engine.close()


def _ollama_routes(app: web.Application) -> None:
    r = app.router
    for path, handler in (
        ("/", ollama_models.root),
        ("/api/version", ollama_models.version),
        ("/api/tags", ollama_models.tags),
    ):
        r.add_get(path, handler)  # aiohttp answers HEAD for GET routes
    r.add_get("/api/ps", ollama_models.ps)
    r.add_post("/api/show", ollama_models.show)
    r.add_post("/api/chat", ollama_routes.chat)
    r.add_post("/api/generate", ollama_routes.generate)
    r.add_post("/api/embed", ollama_routes.embed)
    r.add_post("/v1/chat/completions", openai_routes.chat_completions)
    r.add_post("/v1/completions", openai_routes.completions)
    r.add_post("/v1/responses", responses_routes.responses)
    r.add_post("/v1/messages", anthropic_routes.messages)
    r.add_get("/v1/models", openai_routes.list_models)
    r.add_get("/v1/models/{model:.+}", openai_routes.retrieve_model)


def _llama_routes(app: web.Application) -> None:
    r = app.router
    for path in ("/health", "/v1/health"):
        r.add_get(path, llama_info.health)
    r.add_get("/props", llama_info.props)
    r.add_get("/slots", llama_info.slots)
    r.add_post("/tokenize", llama_info.tokenize)
    r.add_post("/detokenize", llama_info.detokenize)
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        r.add_post(path, llama_info.input_tokens)
    for path in ("/completion", "/completions"):
        r.add_post(path, llama_routes.completion)
    for path in ("/chat/completions", "/v1/chat/completions"):
        r.add_post(path, llama_routes.chat_completions)
    r.add_post("/v1/completions", llama_routes.oai_completions)
    for path in ("/responses", "/v1/responses"):
        r.add_post(path, llama_routes.responses)
    r.add_post("/v1/messages", llama_routes.messages)
    r.add_post("/infill", llama_routes.infill)
    for path in ("/embedding", "/embeddings"):
        r.add_post(path, llama_embeddings.embedding)
    r.add_post("/v1/embeddings", llama_embeddings.embedding_oai)
    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        r.add_post(path, llama_embeddings.rerank)
    r.add_post("/v1/messages/count_tokens", llama_info.anthropic_count_tokens)
    for path in ("/responses/input_tokens", "/v1/responses/input_tokens"):
        r.add_post(path, llama_info.responses_input_tokens)
    for path in ("/models", "/v1/models"):
        r.add_get(path, llama_info.models)
