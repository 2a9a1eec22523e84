"""A small vLLM-shaped OpenAI server for the tests: a real aiohttp application on 127.0.0.1:0.

It answers what vLLM answers (vllm/entrypoints/openai: ``/v1/models``, ``/tokenize``, ``/v1/chat/completions``,
``/v1/completions``), with one deterministic tokenizer used everywhere, so kvgate's count can be checked against
what the server then reports:

    text       ceil(UTF-8 bytes / 4) tokens (+1 BOS with add_special_tokens, vLLM's default for prompts)
    chat       per message 4 + its text's tokens, per tool its JSON's tokens, + 3 for the generation prompt

    POST /tokenize {"model"?, "messages" | "prompt", "add_special_tokens"?} -> {"count", "max_model_len", "tokens"}
         (404 {"detail": "Not Found"} when built with ``tokenize=False``; 404 for a model it does not serve)
    a prompt + max_tokens past max_model_len -> 400 {"object": "error", "message": "This model's maximum context
         length is N tokens. However, you requested ...", "type": "BadRequestError", "code": 400}, as vLLM does;
         max_tokens absent means the rest of max_model_len
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.fake_backend import serve


def text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / 4)


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def chat_tokens(messages: list[Any], tools: list[Any] | None = None) -> int:
    tokens = sum(4 + text_tokens(_message_text(m)) for m in messages) + 3
    return tokens + sum(text_tokens(json.dumps(t)) for t in tools or ())


@dataclass
class FakeVllm:
    model: str = "qwen2.5-7b-instruct"
    max_model_len: int = 4096
    tokenize: bool = True
    url: str = ""
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [body for seen_path, body in self.seen if seen_path == path]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        if self.tokenize:
            app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        return app

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "owned_by": "vllm", "max_model_len": self.max_model_len}]})

    async def _read(self, request: web.Request) -> dict[str, Any]:
        body: dict[str, Any] = await request.json()
        self.seen.append((request.path, body))
        return body

    def _model_error(self, body: dict[str, Any]) -> web.Response | None:
        model = body.get("model")
        if model is None or model == self.model:
            return None
        return web.json_response({"object": "error", "message": f"The model `{model}` does not exist.",
                                  "type": "NotFoundError", "param": None, "code": 404}, status=404)

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        wrong = self._model_error(body)
        if wrong is not None:
            return wrong
        if "messages" in body:
            count = chat_tokens(body["messages"], body.get("tools"))
        else:
            count = text_tokens(str(body.get("prompt", ""))) + (1 if body.get("add_special_tokens", True) else 0)
        return web.json_response({"count": count, "max_model_len": self.max_model_len,
                                  "tokens": list(range(count)), "token_strs": None})

    async def _generate(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        wrong = self._model_error(body)
        if wrong is not None:
            return wrong
        chat = request.path == "/v1/chat/completions"
        prompt = chat_tokens(body["messages"], body.get("tools")) if chat else \
            text_tokens(str(body.get("prompt", ""))) + 1
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        output = self.max_model_len - prompt if asked is None else int(asked)
        if prompt + output > self.max_model_len or output < 1:
            where = "messages" if chat else "prompt"
            return web.json_response({
                "object": "error", "type": "BadRequestError", "param": None, "code": 400,
                "message": f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                           f"requested {prompt + output} tokens ({prompt} in the {where}, {output} in the "
                           "completion). Please reduce the length of the messages or completion."}, status=400)
        answer = min(output, 5)
        usage = {"prompt_tokens": prompt, "completion_tokens": answer, "total_tokens": prompt + answer}
        text = " ".join(["ok"] * answer)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if answer == output else "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return web.json_response({"id": "cmpl-vllm", "object": "chat.completion" if chat else "text_completion",
                                  "created": 1, "model": self.model, "choices": [choice], "usage": usage})


@contextlib.asynccontextmanager
async def running_vllm(fake: FakeVllm) -> AsyncIterator[FakeVllm]:
    async with serve(fake.app()) as url:
        fake.url = url
        yield fake
