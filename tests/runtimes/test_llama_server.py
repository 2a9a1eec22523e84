"""llama-server's runtime: its listing's ``models`` array serves /api/tags; its counter chain asks it first."""

from __future__ import annotations

import aiohttp

from gateway.backends import BackendClient
from gateway.domain import BackendKind
from gateway.runtimes import runtime_for
from gateway.tokens.factory import CountingSettings

RUNTIME = runtime_for(BackendKind.LLAMA_SERVER)


def test_its_listing_names_its_model_and_aliases() -> None:
    listing = {"models": [{"name": "m.gguf", "model": "m.gguf"}], "data": [{"id": "m.gguf", "aliases": ["m"]}]}
    assert RUNTIME.model_names(listing) == {"m.gguf", "m"}
    assert RUNTIME.ollama_tags(listing) == listing["models"]


async def test_its_chain_asks_the_server_first_and_estimates_last() -> None:
    async with aiohttp.ClientSession() as session:
        chain = RUNTIME.counter_chain("", client=BackendClient(session, "http://127.0.0.1:9"),
                                      settings=CountingSettings())
    assert [counter.name for counter in chain.counters] == ["llama-server", "estimate"]
