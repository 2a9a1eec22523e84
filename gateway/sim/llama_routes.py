"""llama-server's HTTP API (llama-server.md sections 1, 2 and 7) over ``LlamaServerEngine``.

Bodies are llama-server's: errors ``{"error": {"code", "message", "type"}}`` (plus ``n_prompt_tokens`` and
``n_ctx`` for ``exceed_context_size_error``), OpenAI responses with ``usage`` (``prompt_tokens_details``) and
``timings``. Streams are SSE; their headers wait for the first result, so a refused prompt is still a 400; an
error after that is one ``data: {"error": ...}`` event and the stream ends without ``[DONE]``.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
from aiohttp import web

from gateway.sim.failures import SimError
from gateway.sim.llama_engine import ExceedContextSize, LlamaServerEngine, ServerResult
from gateway.sim.state import SIM_STATE
from gateway.sim.templates import Message, render
from gateway.sim.wire import LazyStream

BUILD_INFO = "b11434-sim"
_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def reply(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json", charset="utf-8")


def error_body(exc: SimError) -> dict[str, Any]:
    """``format_error_response`` (and ``server_task_result_error::to_json`` for context-size errors)."""
    if isinstance(exc, ExceedContextSize):
        return {
            "error": {
                "code": 400,
                "message": exc.message,
                "type": "exceed_context_size_error",
                "n_prompt_tokens": exc.n_prompt_tokens,
                "n_ctx": exc.n_ctx,
            }
        }
    return {"error": {"code": exc.status, "message": exc.message, "type": _ERROR_TYPES.get(exc.status, "server_error")}}


def error_reply(exc: SimError) -> web.Response:
    return reply(exc.status, error_body(exc))


async def read_json(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError as exc:
        raise SimError(400, f"[json.exception.parse_error.101] parse error: {exc}") from None
    if not isinstance(body, dict):
        raise SimError(400, "request body must be a JSON object")
    return body


def engine_of(request: web.Request) -> LlamaServerEngine:
    return request.app[SIM_STATE].llama


def chat_tokens(engine: LlamaServerEngine, body: dict[str, Any]) -> list[int]:
    messages = body.get("messages")
    if messages is None:
        raise SimError(400, "'messages' is required")
    if not isinstance(messages, list):
        raise SimError(400, "Expected 'messages' to be an array")
    parsed = [
        Message(str(m.get("role", "")), m["content"] if isinstance(m.get("content"), str) else "")
        for m in messages
        if isinstance(m, dict)
    ]
    return engine.tokenizer.encode(render(engine.template, parsed))


def _n_predict(body: dict[str, Any]) -> int:
    for key in ("n_predict", "max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < -1:
            raise SimError(400, f"Field '{key}': Value must be between -1 and 2147483647")
        return value
    return -1


def _timings(r: ServerResult, n_pred: int) -> dict[str, Any]:
    prompt_ms, pred_ms = r.prompt_s * 1000, r.predicted_s * 1000
    return {
        "cache_n": 0,
        "prompt_n": r.n_prompt,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(r.n_prompt, 1),
        "prompt_per_second": r.n_prompt / r.prompt_s if r.prompt_s else 0.0,
        "predicted_n": n_pred,
        "predicted_ms": pred_ms,
        "predicted_per_token_ms": pred_ms / max(n_pred, 1),
        "predicted_per_second": n_pred / r.predicted_s if r.predicted_s else 0.0,
    }


async def chat_completions(request: web.Request) -> web.StreamResponse:
    engine = engine_of(request)
    state = request.app[SIM_STATE]
    try:
        body = await read_json(request)
        prompt = chat_tokens(engine, body)
        n_predict = _n_predict(body)
    except SimError as exc:
        return error_reply(exc)
    ident = "chatcmpl-" + "".join(
        random.Random(state.stats.requests).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=32)
    )
    head = {
        "created": int(state.clock.wall().timestamp()),
        "id": ident,
        "model": engine.spec.name,
        "system_fingerprint": BUILD_INFO,
    }
    stream = body.get("stream") is True
    opts = body.get("stream_options")
    include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
    out = LazyStream(request, "text/event-stream")
    result = ServerResult()
    text: list[str] = []
    state.stats.requests += 1
    try:
        async with engine.slot() as slot:
            first = True
            async for token in engine.run(slot, prompt, n_predict, result):
                piece = engine.tokenizer.piece(token)
                text.append(piece)
                if stream:
                    if first:
                        await _sse(
                            out,
                            {
                                "choices": [
                                    {"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}
                                ],
                                **head,
                                "object": "chat.completion.chunk",
                            },
                        )
                        first = False
                    await _sse(
                        out,
                        {
                            "choices": [{"finish_reason": None, "index": 0, "delta": {"content": piece}}],
                            **head,
                            "object": "chat.completion.chunk",
                        },
                    )
    except SimError as exc:
        state.stats.failed += 1
        if stream and out.started:
            await _sse(out, error_body(exc))
            return await out.finish()
        return error_reply(exc)
    state.stats.completed += 1
    n = len(result.content_ids)
    usage = {
        "completion_tokens": n,
        "prompt_tokens": result.n_prompt,
        "total_tokens": n + result.n_prompt,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    if not stream:
        choice = {
            "finish_reason": result.finish_reason,
            "index": 0,
            "message": {"role": "assistant", "content": "".join(text)},
        }
        return reply(
            200,
            {"choices": [choice], **head, "object": "chat.completion", "usage": usage, "timings": _timings(result, n)},
        )
    await _sse(
        out,
        {
            "choices": [{"finish_reason": result.finish_reason, "index": 0, "delta": {}}],
            **head,
            "object": "chat.completion.chunk",
            "timings": _timings(result, n),
        },
    )
    if include_usage:
        await _sse(out, {"choices": [], **head, "object": "chat.completion.chunk", "usage": usage})
    await out.write(b"data: [DONE]\n\n")
    return await out.finish()


async def _sse(out: LazyStream, obj: dict[str, Any]) -> None:
    await out.write(b"data: " + orjson.dumps(obj) + b"\n\n")


async def completion(request: web.Request) -> web.StreamResponse:
    """Native ``/completion``: ``prompt`` is a string or a list of token ids."""
    engine = engine_of(request)
    state = request.app[SIM_STATE]
    try:
        body = await read_json(request)
        raw = body.get("prompt", "")
        if isinstance(raw, list) and all(isinstance(t, int) for t in raw):
            prompt = list(raw)
        elif isinstance(raw, str):
            prompt = engine.tokenizer.encode(raw)
        else:
            raise SimError(400, '"prompt" must be a string, a list of tokens, or a list of mixed strings & tokens')
        n_predict = _n_predict(body)
    except SimError as exc:
        return error_reply(exc)
    stream = body.get("stream") is True
    out = LazyStream(request, "text/event-stream")
    result = ServerResult()
    state.stats.requests += 1
    try:
        async with engine.slot() as slot:
            async for token in engine.run(slot, prompt, n_predict, result):
                if stream:
                    await _sse(
                        out,
                        {
                            "index": 0,
                            "content": engine.tokenizer.piece(token),
                            "tokens": [token],
                            "stop": False,
                            "id_slot": slot.id,
                            "tokens_predicted": slot.n_decoded,
                            "tokens_evaluated": len(prompt),
                        },
                    )
    except SimError as exc:
        state.stats.failed += 1
        if stream and out.started:
            await _sse(out, error_body(exc))
            return await out.finish()
        return error_reply(exc)
    state.stats.completed += 1
    n = len(result.content_ids)
    final = {
        "index": 0,
        "content": "" if stream else "".join(engine.tokenizer.piece(t) for t in result.content_ids),
        "tokens": [],
        "id_slot": result.id_slot,
        "stop": True,
        "model": engine.spec.name,
        "tokens_predicted": n,
        "tokens_evaluated": len(prompt),
        "generation_settings": {"n_predict": n_predict, "stream": stream},
        "prompt": "",
        "has_new_line": False,
        "truncated": result.stop_type == "limit",
        "stop_type": result.stop_type,
        "stopping_word": "",
        "tokens_cached": len(prompt) + n,
        "timings": _timings(result, n),
    }
    if not stream:
        return reply(200, final)
    await _sse(out, final)
    return await out.finish()
