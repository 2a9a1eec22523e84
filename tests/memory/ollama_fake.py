"""A fake Ollama (a real aiohttp app) whose /api/show answers are built from real GGUF metadata."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.memory.gguf_file import read_gguf

VOCAB_DIR = Path(__file__).resolve().parents[2] / "gateway" / "data" / "vocab"


def show_answer(vocab_file: str, *, verbose: bool, num_ctx: int | None = 8192) -> dict[str, Any]:
    """/api/show as Ollama builds it: model_info is the GGUF key/values; without verbose arrays are null."""
    metadata = read_gguf(VOCAB_DIR / vocab_file).metadata
    info: dict[str, Any] = {}
    for key, value in metadata.items():
        if key.endswith(".count") and key.startswith("tokenizer.ggml."):
            info[key.removesuffix(".count")] = ["<tok>"] * 3 if verbose else None
        elif isinstance(value, list):
            info[key] = value if verbose else None
        elif key not in ("general.name", "tokenizer.chat_template"):
            info[key] = value
    info["general.parameter_count"] = 8_030_261_248
    return {
        "license": "...",
        "modelfile": "FROM /models/blob\n",
        "parameters": f"num_ctx                        {num_ctx}\nstop \"<|eot_id|>\"" if num_ctx else "",
        "template": "{{ .Prompt }}",
        "details": {"parent_model": "", "format": "gguf", "family": metadata["general.architecture"],
                    "families": [metadata["general.architecture"]], "parameter_size": "8.0B",
                    "quantization_level": "Q4_K_M"},
        "model_info": info,
        "tensors": [
            {"name": "token_embd.weight", "type": "Q4_K", "shape": [4096, 128256]},
            {"name": "output_norm.weight", "type": "F32", "shape": [4096]},
        ],
        "capabilities": ["completion", "tools"],
        "modified_at": "2026-11-01T10:00:00Z",
    }


class FakeOllama:
    def __init__(self, models: dict[str, tuple[str, str]]) -> None:
        """models: name -> (vocab file whose metadata to serve, digest)."""
        self.models = models
        self.show_bodies: list[dict[str, Any]] = []
        self.ps_models: Sequence[dict[str, Any]] = ()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/version", self.version)
        app.router.add_get("/api/tags", self.tags)
        app.router.add_post("/api/show", self.show)
        app.router.add_get("/api/ps", self.ps)
        return app

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "0.33.0"})

    async def tags(self, _: web.Request) -> web.Response:
        models = [
            {"name": name, "model": name, "digest": digest, "size": 4_920_734_016}
            for name, (_, digest) in self.models.items()
        ]
        return web.json_response({"models": models})

    async def show(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.show_bodies.append(body)
        if body["model"] not in self.models:
            return web.json_response({"error": f"model '{body['model']}' not found"}, status=404)
        vocab, _ = self.models[body["model"]]
        return web.json_response(show_answer(vocab, verbose=bool(body.get("verbose"))))

    async def ps(self, _: web.Request) -> web.Response:
        return web.json_response({"models": list(self.ps_models)})
