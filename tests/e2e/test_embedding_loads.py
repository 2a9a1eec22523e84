"""Issue 22 point 5 on Ollama: an embedding request for a model that is not loaded goes through the load gate like a
chat's load, so the embedding model's load is counted in the GPU ledger; it holds no KV reservation (Ollama's
embedding models keep no KV cache, and run alone)."""

from __future__ import annotations

from tests.e2e.test_load_admission import GIB, backend_for, call, simulator, stats
from tests.support.gateway_server import running_gateway

MODELS = ("llama3.1:8b", "nomic-embed-text")


async def test_an_embedding_models_load_is_gated_and_counted() -> None:
    async with simulator(models=MODELS) as sim, running_gateway([backend_for(sim)]) as url:
        status, headers, body = await call(url, "POST", "/api/embed", {"model": "nomic-embed-text",
                                                                        "input": ["hello", "world"]})
        assert status == 200 and len(body["embeddings"]) == 2
        assert "X-Kvgate-Reserved-Tokens" not in headers  # no KV reservation on Ollama
        counts = await stats(sim)
        gpu = (await call(url, "GET", "/kvgate/status"))[2]["gpus"][0]
        assert gpu["loads"]["loads"] == 1 and counts["loads"] == 1 and counts["load_failures"] == 0
        ps = (await call(sim, "GET", "/api/ps"))[2]["models"]
        assert [m["name"] for m in ps] == ["nomic-embed-text:latest"]
        status, _, _ = await call(url, "POST", "/api/embed", {"model": "nomic-embed-text", "input": "again"})
        gpu = (await call(url, "GET", "/kvgate/status"))[2]["gpus"][0]
        assert status == 200 and gpu["loads"]["loads"] == 1  # resident: not loaded again


async def test_an_embedding_load_that_cannot_fit_is_refused_not_attempted() -> None:
    """A foreign process holds nearly all of the GPU: straight at Ollama the embedding model's load fails; through
    kvgate the load waits (``load_wait_s``) and is refused with the numbers, and Ollama never tried it."""
    async with simulator(models=MODELS, llama_fit=False, gpu_bytes=(4 * GIB,)) as sim, running_gateway(
            [{**backend_for(sim), "cpu_offload": "off"}], residency={"load_wait_s": 0.2}) as url:  # fit off: no spill
        status, _, pid = await call(sim, "POST", "/sim/processes", {"name": "trainer", "bytes": 4 * GIB - (64 << 20)})
        assert status in (200, 201), pid
        status, _, body = await call(url, "POST", "/api/embed", {"model": "nomic-embed-text", "input": "hi"})
        assert status == 503 and "nomic-embed-text" in body["error"] and "bytes" in body["error"]
        counts = await stats(sim)
        assert counts["loads"] == 0 and counts["load_failures"] == 0
        straight, _, failed = await call(sim, "POST", "/api/embed", {"model": "nomic-embed-text", "input": "hi"})
        assert straight == 500, failed
