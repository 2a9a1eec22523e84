"""Issue 22 point 5 against a real llama-server (the tiny model, ``-c 1024``, ``-np`` omitted: 4 slots on one unified
pool of 1,024 cells, started with ``--reranking``, which serves embeddings too).

- A multi-prompt batch that fails straight at the server (500 "Context size has been exceeded.": four tasks of 150
  prompt tokens and 200 generated ones need 1,400 cells at once) completes through kvgate, which lowers its output
  so the four fit together, and says so; a burst of such batches completes too.
- The reply shapes the simulator copies, read from the real server: a native batch is an array (``index`` per
  prompt), /v1/completions one choice per prompt, embeddings one entry per input, a rerank one result per document;
  kvgate's per-prompt counts match the server's own usage.
- The tiny model does rerank (``--reranking``: rank pooling on its random weights gives scores) and embed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.gateway_server import running_gateway
from tests.support.llama_server import RunningLlamaServer, run_llama_server
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.llama_server

CONTEXT_EXCEEDED = "Context size has been exceeded."
WORDS = ("apple", "river", "stone", "cloud", "green", "table", "window", "music", "paper", "light")


@pytest.fixture(scope="module")
def server(llama_server_bin: Path) -> Iterator[RunningLlamaServer]:
    model = write_tiny_model(n_ctx_train=4096)
    with run_llama_server(model, "-c", "1024", "-t", "2", "-a", "tiny", "--reranking", log_verbosity=1,
                          binary=llama_server_bin) as running:
        yield running


def text(index: int, words: int) -> str:
    return " ".join(WORDS[(index * 3 + j) % len(WORDS)] for j in range(words))


async def post(url: str, body: Any) -> tuple[int, dict[str, str], Any]:
    # no keep-alive: cpp-httplib closes a connection after a few requests (see the no-escape matrix)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http, \
            http.post(url, json=body) as response:
        return response.status, dict(response.headers), orjson.loads(await response.read())


async def test_a_batch_that_fails_straight_at_the_server_completes_through_kvgate(server: RunningLlamaServer) -> None:
    body = {"prompt": [text(i, 150) for i in range(4)], "n_predict": 200, "ignore_eos": True}
    status, _, straight = await post(server.url + "/completion", body)
    assert status == 500 and straight["error"]["message"] == CONTEXT_EXCEEDED
    async with running_gateway([{"name": "cpp", "kind": "llama-server", "url": server.url}]) as url:
        status, headers, payload = await post(url + "/completion", body)
        burst = await asyncio.gather(*(post(url + "/v1/completions", {**body, "max_tokens": 200, "prompt": [
            text(10 * r + i, 150) for i in range(4)]}) for r in range(3)))
    prompts = [r["tokens_evaluated"] for r in payload]
    print(f"\nreal llama-server: straight 500 '{CONTEXT_EXCEEDED}'; through kvgate {status}, prompts {prompts}, "
          f"{headers['X-Kvgate-Rewrite']}, reserved {headers['X-Kvgate-Reserved-Tokens']} of 1,024 cells; "
          f"a burst of 3 such batches: {[s for s, _, _ in burst]}")
    assert status == 200 and [r["index"] for r in payload] == [0, 1, 2, 3]
    predicted = payload[0]["tokens_predicted"]
    assert headers["X-Kvgate-Rewrite"] == f"n_predict={predicted} (was 200)"
    assert int(headers["X-Kvgate-Prompt-Tokens"]) == sum(prompts)  # each prompt counted exactly (/tokenize)
    assert int(headers["X-Kvgate-Reserved-Tokens"]) == sum(prompts) + 4 * predicted <= 1024
    assert [s for s, _, _ in burst] == [200] * 3
    assert all(len(p["choices"]) == 4 and [c["index"] for c in p["choices"]] == [0, 1, 2, 3] for _, _, p in burst)


async def test_embeddings_and_reranks_through_kvgate(server: RunningLlamaServer) -> None:
    inputs = [text(i, 20 + 10 * i) for i in range(3)]
    async with running_gateway([{"name": "cpp", "kind": "llama-server", "url": server.url}]) as url:
        status, headers, embedded = await post(url + "/v1/embeddings", {"input": inputs})
        native_status, _, native = await post(url + "/embedding", {"content": inputs[:2]})
        rerank_status, rerank_headers, ranked = await post(
            url + "/rerank", {"query": "which is green", "documents": inputs, "top_n": 2})
    assert status == 200 and [d["index"] for d in embedded["data"]] == [0, 1, 2]
    assert int(headers["X-Kvgate-Reserved-Tokens"]) == embedded["usage"]["prompt_tokens"]  # exact, no output
    assert native_status == 200 and [e["index"] for e in native] == [0, 1] and len(native[0]["embedding"]) == 1
    assert rerank_status == 200 and len(ranked["results"]) == 2
    assert int(rerank_headers["X-Kvgate-Reserved-Tokens"]) >= ranked["usage"]["prompt_tokens"]  # an estimate above
