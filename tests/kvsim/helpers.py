"""Running simulators on loopback for the tests, fast: one real second is many simulated ones."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp

from gateway.memory.kv import ModelShape
from kvsim.catalog import ModelSpec
from kvsim.config import SimConfig
from kvsim.gpu.vgpu import GIB
from kvsim.runner import start_sim

FAST = SimConfig(
    models=("llama3.1:8b", "qwen2.5:7b", "nomic-embed-text"),
    time_scale=400.0,
    load_s=2.0,
    prompt_tokens_per_s=4000.0,
    gen_tokens_per_s=100.0,
    min_response_tokens=8,
    max_response_tokens=24,
)


def fast(**changes: Any) -> SimConfig:
    return replace(FAST, **changes)


def gateway_shape(spec: ModelSpec) -> ModelShape:
    """A catalog model in the gateway's ``ModelShape``, built from its hyper-parameters (not from its metadata),
    to check the simulator's allocations and ``model_info`` against the gateway's memory math."""
    a = spec.arch
    return ModelShape(
        architecture=spec.gguf_arch,
        n_layers=a.n_layers,
        n_embd=a.n_embd,
        n_head=(a.n_head,) * a.n_layers,
        n_head_kv=(0 if spec.is_embedding else a.n_head_kv,) * a.n_layers,
        key_length=a.head_dim,
        value_length=a.head_dim,
        key_length_swa=a.head_dim,
        value_length_swa=a.head_dim,
        swa_layers=spec.swa_layers,
        sliding_window=spec.sliding_window,
        n_ctx_train=spec.n_ctx_train,
    )


@contextlib.asynccontextmanager
async def running_sim(config: SimConfig) -> AsyncIterator[str]:
    runner, url = await start_sim(config)
    try:
        yield url
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def sim_session(config: SimConfig) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with running_sim(config) as url, aiohttp.ClientSession(url) as session:
        yield url, session


async def post(session: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, Any]:
    async with session.post(path, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def post_raw(session: aiohttp.ClientSession, path: str, data: bytes) -> tuple[int, bytes, str]:
    async with session.post(path, data=data, headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.read(), resp.content_type


async def get(session: aiohttp.ClientSession, path: str) -> tuple[int, Any]:
    async with session.get(path) as resp:
        return resp.status, await resp.json(content_type=None)


def chat_body(content: str = "Hello world, how are you?", **extra: Any) -> dict[str, Any]:
    return {"model": "llama3.1:8b", "messages": [{"role": "user", "content": content}], "stream": False, **extra}


__all__ = ["GIB", "chat_body", "fast", "get", "post", "post_raw", "running_sim", "sim_session"]
