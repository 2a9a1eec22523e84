"""Real loopback HTTP servers that stand in for llama-server's count routes and Ollama's model routes."""

from __future__ import annotations

import contextlib
from collections import Counter as Calls
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serve(routes: Mapping[tuple[str, str], Handler]) -> AsyncIterator[str]:
    """Serve `routes` ((method, path) -> handler) on 127.0.0.1 with a free port; yields the base URL."""
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclass
class FakeOllama:
    """/api/tags and /api/show for one model whose model_info is `model_info`; counts the calls it gets."""

    model: str
    digest: str
    model_info: dict[str, Any]
    calls: Calls[str] = field(default_factory=Calls)

    async def tags(self, request: web.Request) -> web.Response:
        self.calls["tags"] += 1
        return web.json_response({"models": [{"name": self.model, "model": self.model, "digest": self.digest}]})

    async def show(self, request: web.Request) -> web.Response:
        self.calls["show"] += 1
        body = await request.json()
        name = str(body.get("model"))
        if (name if ":" in name else f"{name}:latest") != self.model:
            return web.json_response({"error": f"model '{body.get('model')}' not found"}, status=404)
        self.calls["show_verbose"] += bool(body.get("verbose"))
        info = self.model_info if body.get("verbose") else {k: None for k in self.model_info}
        return web.json_response({"model_info": info, "template": "{{ .Prompt }}"})

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {("GET", "/api/tags"): self.tags, ("POST", "/api/show"): self.show}
