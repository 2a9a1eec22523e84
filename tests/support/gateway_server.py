"""Run a real kvgate on 127.0.0.1:0 for a test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gateway.app import create_app, start_server
from gateway.config.settings import Settings, load_settings


@asynccontextmanager
async def running_gateway(backends: list[dict[str, Any]], **overrides: Any) -> AsyncIterator[str]:
    settings: Settings = load_settings(None, backends=backends, **overrides)
    app = create_app(settings, refresh_models=False)
    runner, port = await start_server(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
