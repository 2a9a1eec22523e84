"""llama-server's embedding and rerank routes (``handle_embeddings_impl``, ``post_rerank``), checked against the real
server with a tiny model (``--embeddings --pooling mean``, ``--reranking``).

Without ``--embeddings`` (``SimConfig.embeddings``) the embedding routes answer 501 "This server does not support
embeddings. Start it with `--embeddings`"; without ``--reranking`` the rerank routes answer 501 "... reranking ...
`--reranking`" (``--reranking`` turns embeddings on too, as the real flag does). Each input (a rerank: each
document, with the query) is a task of its own: it waits for a slot like any task, holds it while its prompt is
processed, and takes the cells of its tokens from the pool as a completion's prompt does, so on a unified pool a
burst of long inputs fails every active task with "Context size has been exceeded.". The first error ends the
request (the other tasks are cancelled). Replies:

    /embedding, /embeddings   [{"index": i, "embedding": [[...]]}, ...]   (input or content)
    /v1/embeddings            {"model", "object": "list", "usage": {prompt_tokens, total_tokens}, "data": [
                               {"embedding": [...], "index": i, "object": "embedding"}, ...]}   (input)
    /rerank and aliases       {"model", "object": "list", "usage", "results": [{"index", "relevance_score"}]} sorted
                              by score, top_n kept; TEI's "texts" gets [{"index", "score"}] (and "text" with
                              return_text)

A rerank pair is BOS query document (the vocabularies simulated add no EOS or SEP). Vectors and scores are
deterministic per input; pooling is mean (one vector per input).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from typing import Any

from aiohttp import web

from kvsim.failures import SimError
from kvsim.llama_server.llama_engine import LlamaServerEngine, ServerResult
from kvsim.llama_server.llama_requests import prompts_of
from kvsim.llama_server.llama_routes import engine_of, error_reply, read_json, reply
from kvsim.state import SIM_STATE

EMBEDDINGS_OFF = "This server does not support embeddings. Start it with `--embeddings`"
RERANKING_OFF = "This server does not support reranking. Start it with `--reranking`"


async def _run_tasks(engine: LlamaServerEngine, prompts: list[list[int]]) -> list[ServerResult]:
    """Every prompt a task in a slot of its own, all at once; the first failure cancels the rest and is raised."""
    results = [ServerResult() for _ in prompts]

    async def one(index: int) -> None:
        async with engine.slot() as slot:
            await engine.process(slot, prompts[index], results[index])

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]
    try:
        for finished in asyncio.as_completed(tasks):
            await finished  # the first SimError propagates
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return results


def _vector(engine: LlamaServerEngine, tokens: list[int]) -> list[float]:
    """A unit vector of the model's embedding length, the same for the same tokens."""
    seed = hashlib.sha256(repr(tokens).encode()).digest()
    raw = [((seed[i % 32] + 31 * i) % 255) / 127.0 - 1.0 for i in range(engine.spec.arch.n_embd)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


def _score(tokens: list[int]) -> float:
    return int.from_bytes(hashlib.sha256(repr(tokens).encode()).digest()[:4], "big") / 2**31 - 1.0


async def _serve(request: web.Request, work: Any) -> web.Response:
    state = request.app[SIM_STATE]
    state.stats.requests += 1
    try:
        response: web.Response = await work
    except SimError as exc:
        state.stats.failed += 1
        return error_reply(exc)
    state.stats.completed += 1
    return response


def _embeddings_on(request: web.Request) -> bool:
    config = request.app[SIM_STATE].config
    return bool(config.embeddings or config.reranking)


async def _embed(request: web.Request, *, oai: bool) -> web.Response:
    engine = engine_of(request)
    body = await read_json(request)
    if "input" in body:
        raw = body["input"]
    elif "content" in body:
        raw, oai = body["content"], False  # "content" is not OpenAI's: the native reply
    else:
        raise SimError(400, '"input" or "content" must be provided')
    prompts = list(prompts_of(engine, raw, field="input"))
    if any(not tokens for tokens in prompts):
        raise SimError(400, "Input content cannot be empty")
    results = await _run_tasks(engine, prompts)
    vectors = [_vector(engine, tokens) for tokens in prompts]
    if not oai:
        return reply(200, [{"index": i, "embedding": [vector]} for i, vector in enumerate(vectors)])
    used = sum(r.n_prompt for r in results)
    return reply(200, {
        "model": body.get("model", engine.spec.name), "object": "list",
        "usage": {"prompt_tokens": used, "total_tokens": used},
        "data": [{"embedding": vector, "index": i, "object": "embedding"} for i, vector in enumerate(vectors)],
    })


async def embedding(request: web.Request) -> web.Response:
    """/embedding, /embeddings (the native reply)."""
    if not _embeddings_on(request):
        return error_reply(SimError(501, EMBEDDINGS_OFF))
    return await _serve(request, _embed(request, oai=False))


async def embedding_oai(request: web.Request) -> web.Response:
    """/v1/embeddings."""
    if not _embeddings_on(request):
        return error_reply(SimError(501, EMBEDDINGS_OFF))
    return await _serve(request, _embed(request, oai=True))


def _pair(engine: LlamaServerEngine, query: str, document: str) -> list[int]:
    bos = [engine.spec.bos_id] if engine.spec.add_bos else []

    def plain(text: str) -> list[int]:
        ids = engine.tokenizer.encode(text)
        return ids[len(bos):] if bos and ids[:1] == bos else ids

    return [*bos, *plain(query), *plain(document)]


async def _rerank(request: web.Request) -> web.Response:
    engine = engine_of(request)
    body = await read_json(request)
    tei = "texts" in body
    if "query" not in body:
        raise SimError(400, '"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise SimError(400, '"query" must be a string')
    documents = body.get("documents", body.get("texts"))
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise SimError(400, '"documents" must be a non-empty string array')
    top_n = body.get("top_n", len(documents))
    prompts = [_pair(engine, query, document) for document in documents]
    results = await _run_tasks(engine, prompts)
    label = "score" if tei else "relevance_score"
    ranked: list[dict[str, Any]] = [{"index": i, label: _score(tokens)} for i, tokens in enumerate(prompts)]
    if tei and body.get("return_text") is True:
        for element in ranked:
            element["text"] = documents[element["index"]]
    ranked.sort(key=lambda element: -float(element[label]))
    ranked = ranked[: max(0, int(top_n)) if isinstance(top_n, int) else len(ranked)]
    if tei:
        return reply(200, ranked)
    used = sum(r.n_prompt for r in results)
    return reply(200, {"model": body.get("model", engine.spec.name), "object": "list",
                       "usage": {"prompt_tokens": used, "total_tokens": used}, "results": ranked})


async def rerank(request: web.Request) -> web.Response:
    """/rerank, /reranking, /v1/rerank, /v1/reranking."""
    if not request.app[SIM_STATE].config.reranking:
        return error_reply(SimError(501, RERANKING_OFF))
    return await _serve(request, _rerank(request))
