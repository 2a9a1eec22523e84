"""Ollama's native API (``server/routes.go``): /api/chat, /api/generate, /api/embed and the model endpoints.

Validation runs in Ollama's order (body -> top_logprobs -> model -> unload request -> capabilities -> options ->
scheduling -> load-only reply), so the same bad request gets the same error. ``stream`` defaults to true;
headers wait for the first chunk, so a failure before any output is a status code with ``{"error": ...}`` and a
failure after it a final ``{"error": ...}`` line under status 200.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

from aiohttp import web

from kvsim.catalog import ModelSpec, lookup
from kvsim.clock import go_time
from kvsim.failures import SimError
from kvsim.ollama import gojson
from kvsim.ollama.ollama_requests import (
    get,
    keep_alive,
    parse_chat,
    parse_embed_input,
    parse_generate,
    think_requested,
)
from kvsim.ollama.ollama_service import Finished, Inference, Piece, full_name
from kvsim.state import SIM_STATE, SimState
from kvsim.templates import Message
from kvsim.wire import LazyStream, json_response

NDJSON = "application/x-ndjson"
Chunk = Callable[[Piece | Finished], dict[str, Any]]


def ns(seconds: float) -> int:
    return int(seconds * 1e9)


def error(status: int, message: str) -> web.Response:
    return json_response(status, {"error": message})


def _spec(state: SimState, name: str, *, status: int, missing: str) -> ModelSpec:
    if not name.strip():
        raise SimError(status, missing)
    spec = lookup(state.models, name)
    if spec is None:
        raise SimError(404, f"model '{name}' not found")
    return spec


def _metrics(fin: Finished) -> dict[str, Any]:
    r = fin.result
    values = {
        "total_duration": ns(fin.total_s),
        "load_duration": ns(fin.load_s),
        "prompt_eval_count": r.prompt_eval_count,
        "prompt_eval_duration": ns(r.prompt_eval_s),
        "eval_count": r.eval_count,
        "eval_duration": ns(r.eval_s),
    }
    return {k: v for k, v in values.items() if v}  # omitempty


async def respond(
    request: web.Request,
    items: AsyncGenerator[Piece | Finished, None],
    stream: bool,
    chunk: Chunk,
    final_text_key: tuple[str, ...],
) -> web.StreamResponse:
    """Stream NDJSON or collect one JSON object; errors as Ollama's ``streamResponse`` writes them."""
    async with contextlib.aclosing(items) as it:
        if not stream:
            text: list[str] = []
            try:
                async for item in it:
                    if isinstance(item, Piece):
                        text.append(item.text)
                    else:
                        final = chunk(item)
                        _set(final, final_text_key, "".join(text))
                        return json_response(200, final)
            except SimError as exc:
                return error(exc.status, exc.message)
            return error(500, "unexpected response")
        out = LazyStream(request, NDJSON)
        try:
            async for item in it:
                await out.write(gojson.dumps(chunk(item)) + b"\n")
        except SimError as exc:
            if not out.started:
                return error(exc.status, exc.message)
            await out.write(gojson.dumps({"error": exc.message}) + b"\n")
        return await out.finish()


def _set(obj: dict[str, Any], path: tuple[str, ...], value: str) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def _check_think(spec: ModelSpec, model: str, think: Any) -> None:
    if "thinking" not in spec.capabilities and think_requested(think):
        raise SimError(400, f'"{model}" does not support thinking')


async def chat(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    try:
        body = parse_chat(gojson.read_object(await request.read(), "ChatRequest"))
        spec = _spec(state, body.model, status=400, missing="model is required")
        now = go_time(state.clock.wall())
        if not body.messages and body.keep_alive_s == 0:
            state.ollama.scheduler.expire_model(spec.name)
            return json_response(
                200,
                {
                    "model": body.model,
                    "created_at": now,
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    "done_reason": "unload",
                },
            )
        _check_think(spec, body.model, body.think)
        if spec.is_embedding:
            raise SimError(400, f'"{body.model}" does not support chat')
        _require(spec, tools=body.has_tools)
        if not body.messages:
            load_s = await state.ollama.load(spec, body.options, body.keep_alive_s, body.shift)
            return json_response(
                200,
                {
                    "model": body.model,
                    "created_at": go_time(state.clock.wall()),
                    "message": {"role": "assistant", "content": ""},
                    "done": True,
                    "done_reason": "load",
                    **({"load_duration": ns(load_s)} if load_s else {}),
                },
            )
    except SimError as exc:
        return error(exc.status, exc.message)
    inf = Inference(
        spec=spec,
        messages=body.messages,
        options=body.options,
        keep_alive_s=body.keep_alive_s,
        truncate=body.truncate,
        shift=body.shift,
    )

    def chunk(item: Piece | Finished) -> dict[str, Any]:
        base = {"model": body.model, "created_at": go_time(state.clock.wall())}
        if isinstance(item, Piece):
            return {**base, "message": {"role": "assistant", "content": item.text}, "done": False}
        return {
            **base,
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": item.result.done_reason,
            **_metrics(item),
        }

    return await respond(request, state.ollama.stream(inf), body.stream, chunk, ("message", "content"))


def _require(spec: ModelSpec, *, tools: bool = False, insert: bool = False) -> None:
    """``CheckCapabilities`` beyond completion (images get no capability check in the handlers)."""
    wanted = [c for c, asked in (("tools", tools), ("insert", insert)) if asked and c not in spec.capabilities]
    if wanted:
        joined = "\n".join(wanted)  # Go's errors.Join
        raise SimError(400, f"{full_name(spec)} does not support {joined}")


async def generate(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    try:
        body = parse_generate(gojson.read_object(await request.read(), "GenerateRequest"))
        spec = _spec(state, body.model, status=404, missing=f"model '{body.model}' not found")
        if not body.prompt and body.keep_alive_s == 0:
            state.ollama.scheduler.expire_model(spec.name)
            return json_response(
                200,
                {
                    "model": body.model,
                    "created_at": go_time(state.clock.wall()),
                    "response": "",
                    "done": True,
                    "done_reason": "unload",
                },
            )
        if body.raw and (body.template or body.system or body.context):
            raise SimError(400, "raw mode does not support template, system, or context")
        _check_think(spec, body.model, body.think)
        if spec.is_embedding:
            raise SimError(400, f'"{body.model}" does not support generate')
        _require(spec, insert=bool(body.suffix))
        if not body.prompt:
            load_s = await state.ollama.load(spec, body.options, body.keep_alive_s, body.shift)
            return json_response(
                200,
                {
                    "model": body.model,
                    "created_at": go_time(state.clock.wall()),
                    "response": "",
                    "done": True,
                    "done_reason": "load",
                    **({"load_duration": ns(load_s)} if load_s else {}),
                },
            )
    except SimError as exc:
        return error(exc.status, exc.message)
    system = [Message("system", body.system)] if body.system else []
    inf = Inference(
        spec=spec,
        messages=(*system, Message("user", body.prompt, body.images)),
        raw_prompt=body.prompt if body.raw else None,
        context_tokens=body.context,
        options=body.options,
        keep_alive_s=body.keep_alive_s,
        truncate=body.truncate,
        shift=body.shift,
    )

    def chunk(item: Piece | Finished) -> dict[str, Any]:
        base = {"model": body.model, "created_at": go_time(state.clock.wall())}
        if isinstance(item, Piece):
            return {**base, "response": item.text, "done": False}
        final: dict[str, Any] = {**base, "response": "", "done": True, "done_reason": item.result.done_reason}
        if not body.raw:
            final["context"] = [*item.prompt_tokens, *item.result.token_ids]
        return {**final, **_metrics(item)}

    return await respond(request, state.ollama.stream(inf), body.stream, chunk, ("response",))


async def embed(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    try:
        raw = gojson.read_object(await request.read(), "EmbedRequest")
        model = get(raw, "model", str, "EmbedRequest", "")
        inputs = parse_embed_input(raw.get("input"))
        alive = keep_alive(raw)
        spec = _spec(state, model, status=404, missing=f"model '{model}' not found")
        vectors, count, load_s = await state.ollama.embed(
            spec,
            inputs,
            raw_options=get(raw, "options", dict, "EmbedRequest"),
            keep_alive_s=alive,
            truncate=get(raw, "truncate", bool, "EmbedRequest", True),
        )
    except SimError as exc:
        return error(exc.status, exc.message)
    body: dict[str, Any] = {"model": model, "embeddings": vectors}
    extra = {"load_duration": ns(load_s), "prompt_eval_count": count}
    return json_response(200, {**body, **{k: v for k, v in extra.items() if v}})
