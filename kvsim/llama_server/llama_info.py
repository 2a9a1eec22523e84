"""llama-server's read-only and token routes: /health, /props, /slots, /tokenize, /detokenize,
/v1/chat/completions/input_tokens (and the Responses and
Anthropic counters), /v1/models, and its 404 body."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kvsim.failures import SimError
from kvsim.llama_server import llama_requests
from kvsim.llama_server.llama_routes import BUILD_INFO, chat_tokens, engine_of, error_reply, read_json, reply
from kvsim.state import SIM_STATE

NOT_FOUND = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}


async def health(request: web.Request) -> web.Response:
    return reply(200, {"status": "ok"})


async def props(request: web.Request) -> web.Response:
    engine = engine_of(request)
    spec = engine.spec
    return reply(
        200,
        {
            "default_generation_settings": {
                "params": {
                    "n_predict": -1,
                    "temperature": 0.8,
                    "top_k": 40,
                    "top_p": 0.95,
                    "stream": False,
                    "n_keep": 0,
                },
                "n_ctx": engine.cells.slot_ctx,
            },
            "total_slots": len(engine.slots),
            "model_alias": spec.name,
            "model_path": f"/models/{spec.name.replace(':', '-')}.gguf",
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": True,
            "endpoint_props": False,
            "endpoint_metrics": False,
            "chat_template": "",
            "bos_token": "",
            "eos_token": "",
            "build_info": BUILD_INFO,
            "is_sleeping": False,
        },
    )


async def slots(request: web.Request) -> web.Response:
    engine = engine_of(request)
    if request.query.get("fail_on_no_slot") == "1" and all(s.processing for s in engine.slots):
        return error_reply(SimError(503, "no slot available"))
    out: list[dict[str, Any]] = []
    for s in engine.slots:
        entry: dict[str, Any] = {"id": s.id, "n_ctx": s.n_ctx, "speculative": False, "is_processing": s.processing}
        if s.id_task >= 0:
            entry.update(
                id_task=s.id_task,
                n_prompt_tokens=s.cells,
                n_prompt_tokens_processed=s.n_prompt_tokens_processed,
                n_prompt_tokens_cache=0,
                params={"n_predict": s.n_predict, "max_tokens": s.n_predict, "stream": s.stream},
                next_token=[
                    {
                        "has_next_token": s.processing,
                        "has_new_line": False,
                        "n_remain": -1 if s.n_predict < 0 else max(s.n_predict - s.n_decoded, 0),
                        "n_decoded": s.n_decoded,
                    }
                ],
            )
        out.append(entry)
    return reply(200, out)


async def tokenize(request: web.Request) -> web.Response:
    engine = engine_of(request)
    try:
        body = await read_json(request)
    except SimError as exc:
        return error_reply(exc)
    content = body.get("content", "")
    ids = engine.tokenizer.encode(content if isinstance(content, str) else "")
    if body.get("add_special") is not True and engine.spec.add_bos and ids[:1] == [engine.spec.bos_id]:
        ids = ids[1:]  # add_special defaults to false
    if body.get("with_pieces") is True:
        return reply(200, {"tokens": [{"id": i, "piece": engine.tokenizer.piece(i)} for i in ids]})
    return reply(200, {"tokens": ids})


async def detokenize(request: web.Request) -> web.Response:
    engine = engine_of(request)
    try:
        body = await read_json(request)
    except SimError as exc:
        return error_reply(exc)
    tokens = [t for t in body.get("tokens") or [] if isinstance(t, int)]
    return reply(200, {"content": "".join(engine.tokenizer.piece(t) for t in tokens)})


async def input_tokens(request: web.Request) -> web.Response:
    engine = engine_of(request)
    try:
        n = len(chat_tokens(engine, await read_json(request)))
    except SimError as exc:
        return error_reply(exc)
    return reply(200, {"input_tokens": n, "object": "response.input_tokens"})


async def responses_input_tokens(request: web.Request) -> web.Response:
    engine = engine_of(request)
    try:
        n = len(llama_requests.responses(engine, await read_json(request)).prompt)
    except SimError as exc:
        return error_reply(exc)
    return reply(200, {"input_tokens": n, "object": "response.input_tokens"})


async def anthropic_count_tokens(request: web.Request) -> web.Response:
    engine = engine_of(request)
    try:
        n = len(llama_requests.anthropic(engine, await read_json(request)).prompt)
    except SimError as exc:
        return error_reply(exc)
    return reply(200, {"input_tokens": n})


async def models(request: web.Request) -> web.Response:
    engine = engine_of(request)
    spec = engine.spec
    meta = {
        "vocab_type": 2,
        "n_vocab": spec.arch.n_vocab,
        "n_ctx": engine.cells.slot_ctx,
        "n_ctx_train": spec.n_ctx_train,
        "n_embd": spec.arch.n_embd,
        "n_params": spec.weights.parameter_count,
        "size": spec.weights.tensor_bytes,
        "ftype": int(spec.file_type),
    }
    entry = {
        "id": spec.name,
        "aliases": [spec.name],
        "tags": [],
        "object": "model",
        "owned_by": "llamacpp",
        "created": int(request.app[SIM_STATE].clock.wall().timestamp()),
        "meta": meta,
    }
    listing = {
        "name": spec.name,
        "model": spec.name,
        "modified_at": "",
        "size": "",
        "digest": "",
        "type": "model",
        "description": "",
        "tags": [""],
        "capabilities": ["completion"],
        "parameters": "",
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": "",
            "families": [""],
            "parameter_size": "",
            "quantization_level": "",
        },
    }
    return reply(200, {"models": [listing], "object": "list", "data": [entry]})


@web.middleware
async def not_found(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return reply(404, NOT_FOUND)
    return response
