"""An OpenAI-compatible server's runtime: forwarded without admission until its KV layout is configured; its
listing's ids become Ollama tags."""

from __future__ import annotations

from typing import cast

from gateway.backends import Backend, BackendClient
from gateway.config.settings import BackendSettings
from gateway.domain import BackendKind
from gateway.runtimes import runtime_for

RUNTIME = runtime_for(BackendKind.OPENAI)


def _backend(**fields: object) -> Backend:
    config = BackendSettings.model_validate({"name": "vllm", "url": "http://127.0.0.1:9", "kind": "openai", **fields})
    return Backend(config, cast(BackendClient, None), runtime=RUNTIME)


def test_a_server_without_its_layout_is_forwarded_without_admission_and_says_how_to_admit_it() -> None:
    reason = RUNTIME.unadmitted_reason(_backend())
    assert reason is not None and "set its parallel and context_tokens" in reason
    assert RUNTIME.unadmitted_reason(_backend(parallel=4, context_tokens=8192)) is None


def test_its_listing_gives_names_and_tags() -> None:
    listing = {"object": "list", "data": [{"id": "gpt-x", "aliases": ["x"]}]}
    assert RUNTIME.model_names(listing) == {"gpt-x", "x"}
    assert [tag["name"] for tag in RUNTIME.ollama_tags(listing)] == ["gpt-x"]
