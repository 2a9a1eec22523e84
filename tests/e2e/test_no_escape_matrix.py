"""No request escapes the ledger (issue 9 point 2): an adversarial matrix, straight at the backend and through kvgate.

Axes: every KV-allocating route the backend serves x streaming or not x output limit (none, a limit, -1, a
small ``max_tokens`` beside a larger ``n_predict``) x model (none, the served name, a made-up name). For each cell
a burst of concurrent requests sized to overrun the backend's KV pool goes straight at the backend, then the same
burst goes through kvgate. ``tests/support/no_escape.py`` says what counts as a failure. Straight at the backend
most cells fail (asserted, so the bursts prove something); through kvgate no cell may fail: every reply is a
completion or a clear refusal in the route's format. Each test prints its matrix before asserting (``-s``).

Backends and bursts:
- the simulator in llama-server mode (phi3:mini, a small vocabulary), ``-c 128``, ``-np`` auto (4 slots on one
  unified 128-cell pool): a pairwise covering of the cross product (``pairwise_cells``: every pair of values of any
  two axes in some cell, ~35 cells, drawn afresh each run from a seed printed with the matrix;
  ``KVGATE_MATRIX_SEED=N`` repeats a run, ``KVGATE_MATRIX=full`` runs the whole cross product of 192 cells, ~15 s)
  (8 routes; ``/infill`` answers 501 there, as the real server does for a model without FIM tokens, so it is
  skipped); 4 chats of ~32 tokens, answers that never stop early (``ignore_eos``, long drawn answers).
  ``/v1/messages`` with ``max_tokens`` 16 beside ``n_predict`` does not overrun even directly: llama-server's
  Anthropic converter drops ``n_predict`` (llama_requests.py), so those two cells are 0/0 by design;
- the simulated Ollama (phi3:mini), ``OLLAMA_CONTEXT_LENGTH=2048``, ``OLLAMA_NUM_PARALLEL=2``: the cross product of its
  KV-allocating routes, pairwise covered as above (``/api/chat``, ``/api/generate``, ``/v1/chat/completions``,
  ``/v1/completions``, ``/v1/responses``, ``/v1/messages``). Ollama gives each sequence its own slot, so its failure is
  the silently truncated prompt: 2 of the 4 prompts are longer than its context. A made-up name is Ollama's clear 404;
  no model is its 400. ``/v1/messages`` without ``max_tokens`` or with -1 is Ollama's 400 "max_tokens is required and
  must be positive" before anything runs, so those four served cells are 0 directly; through kvgate they complete, since
  kvgate writes the limit it reserved into ``max_tokens`` (planner rule 3);
- a real llama-server with a tiny model (deepseek-coder's vocabulary, which has FIM tokens, so ``/infill`` works),
  kvgate given no GGUF path, as for a remote server: ``-c 1024`` with ``-np`` omitted (unified) and ``-c 1024 -np 4``
  (four 256-cell slots; one prompt of the burst is longer than a slot). A covering subset: one cell per route, the
  other axes cycling (``covering_cells``), so every value of every axis appears at least once per layout, and
  the two layouts use different combinations.

Issue 22 point 5 adds the shapes a backend runs as several sequences (``BATCH_SHAPES``: batches of strings, of
token-id lists, mixed, of one, past the slot count, an empty batch, nested garbage; embeddings of one and of many
inputs; reranks of many documents), each streamed and not where the route streams, against the simulated
llama-server (``-c 256``, 4 slots on one unified pool, ``--embeddings --reranking``): a burst of 4 requests whose
tasks together overrun the pool (batches of ~58-token prompts with 120-token answers; embedding and rerank inputs
of ~133 tokens, two of which overrun it while they are processed). Straight at the simulator every shape the server
accepts fails somewhere ("Context size has been exceeded."); through kvgate none does, and every one completes (the
empty batch and the garbage are the server's own 400, both ways).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from kvsim.config import SimConfig
from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway
from tests.support.llama_server import RunningLlamaServer, run_llama_server
from tests.support.no_escape import (
    BATCH_SHAPES,
    LLAMA_ROUTES,
    MATRICES,
    MODELS,
    OLLAMA_ROUTES,
    REFUSED_SHAPES,
    Cell,
    Shape,
    Tally,
    Target,
    bodies_for,
    burst,
    covering_cells,
    failure_reasons,
    full_cross_product,
    render_matrix,
    render_shapes,
    shape_body,
    sim_stat,
)
from tests.support.tinymodel import VOCAB_DIR, write_tiny_model

Results = dict[Cell, tuple[Tally, Tally]]
TIMEOUT_S = 60.0
MATRIX_SEED = int(os.environ.get("KVGATE_MATRIX_SEED") or random.SystemRandom().randrange(2**32))


def pairwise_cells(routes: tuple[str, ...], seed: int) -> list[Cell]:
    """A covering subset of ``full_cross_product(routes)``: every pair of values of any two axes appears in at
    least one cell (greedy, over the cells in a seeded order); ``KVGATE_MATRIX=full``: the whole product."""
    everything = full_cross_product(routes)
    if os.environ.get("KVGATE_MATRIX", "").strip().lower() == "full":
        return everything

    def pairs(cell: Cell) -> set[tuple[int, object, int, object]]:
        values = (cell.route, cell.stream, cell.limit, cell.model)
        return {(i, values[i], j, values[j]) for i, j in itertools.combinations(range(4), 2)}

    candidates = everything[:]
    random.Random(seed).shuffle(candidates)
    uncovered = set().union(*(pairs(c) for c in candidates))
    chosen: list[Cell] = []
    while uncovered:
        best = max(candidates, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return sorted(chosen, key=everything.index)

SIM_LLAMA = Target(
    "simulated llama-server, -c 128, 4 slots on one unified pool",
    "llama-server",
    "phi3:mini",
    prompt_words=(20,) * 4,
    limit_tokens=75,
)
SIM_LLAMA_CONFIG = SimConfig(
    mode="llama-server",
    server_model="phi3:mini",  # a 32k vocabulary: the simulator's tokenizer builds in a fraction of a second
    ctx_size=128,
    time_scale=10.0,
    prompt_tokens_per_s=20000.0,
    gen_tokens_per_s=2000.0,
    min_response_tokens=5000,
    max_response_tokens=5000,
)
SIM_OLLAMA = Target(
    "simulated Ollama, OLLAMA_CONTEXT_LENGTH=2048, OLLAMA_NUM_PARALLEL=2",
    "ollama",
    "phi3:mini",
    prompt_words=(500, 500, 2300, 2300),
    limit_tokens=64,
)
SIM_OLLAMA_CONFIG = SimConfig(
    models=("phi3:mini",),  # a 32k vocabulary: quick to build for the simulator and to convert for kvgate
    num_parallel=2,
    context_length=2048,
    load_s=0.5,
    time_scale=50.0,
    prompt_tokens_per_s=20000.0,
    gen_tokens_per_s=500.0,
    min_response_tokens=8,
    max_response_tokens=16,
)
REAL_UNIFIED = Target(
    "real llama-server, -c 1024, -np omitted (4 slots, unified pool)",
    "llama-server",
    "tiny",
    prompt_words=(150,) * 4,
    limit_tokens=200,
)
REAL_SPLIT = Target(
    "real llama-server, -c 1024 -np 4 (4 slots of 256)",
    "llama-server",
    "tiny",
    prompt_words=(60, 60, 60, 300),
    limit_tokens=120,
)


@asynccontextmanager
async def _sim(config: SimConfig) -> AsyncIterator[str]:
    async with running_sim(config) as url:
        yield url


async def _supported(http: aiohttp.ClientSession, url: str, target: Target, cell: Cell) -> bool:
    """False when the backend answers 501 (``/infill`` without FIM tokens): the route is not served."""
    async with http.post(url + cell.route, json=bodies_for(target, cell)[0] | {"n_predict": 1}) as response:
        await response.read()
        return response.status != 501


async def _run_matrix(
    target: Target, cells: list[Cell], direct_url: str, gated_url: str, stats_urls: tuple[str, str] | None = None
) -> tuple[Results, list[str]]:
    """Each cell's burst straight at ``direct_url``, then through kvgate at ``gated_url``; with ``stats_urls``
    (two Ollama simulators, one behind each), silent truncations count as failures."""
    results: Results = {}
    skipped: list[str] = []
    # no keep-alive: llama-server (cpp-httplib) closes a connection after a few requests, and a POST on a
    # connection it has just closed fails with a reset that says nothing about admission
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        first = {c.route: c for c in reversed(cells)}
        unsupported = {route for route, c in first.items() if not await _supported(http, direct_url, target, c)}
        for cell in cells:
            if cell.route in unsupported:
                skipped.append(cell.route)
                continue
            bodies = bodies_for(target, cell)
            outcomes = []
            for url, stats in zip((direct_url, gated_url), stats_urls or (None, None), strict=True):
                cut_before = await sim_stat(http, stats, "truncated_prompts") if stats else 0
                tally = await burst(http, url, cell.route, bodies, TIMEOUT_S)
                if stats:
                    cut = await sim_stat(http, stats, "truncated_prompts") - cut_before
                    tally.failed += cut
                    tally.ok -= cut
                    tally.reasons += ["200 with a silently truncated prompt"] * cut
                outcomes.append(tally)
            results[cell] = (outcomes[0], outcomes[1])
    return results, sorted(set(skipped))


def _report(target: Target, results: Results, skipped: list[str], started: float, seed: int | None = None) -> None:
    lines = [render_matrix(target.title, results)]
    if seed is not None:
        lines.append(f"cells drawn with KVGATE_MATRIX_SEED={seed} (KVGATE_MATRIX=full: the whole cross product)")
    if skipped:
        lines.append(f"skipped (the backend answers 501, not served): {', '.join(skipped)}")
    reasons = failure_reasons(results)
    if reasons:
        lines.append("through kvgate, failing cells (first reason):\n" + reasons)
    lines.append(f"wall time: {time.monotonic() - started:.1f} s")
    print("\n" + "\n".join(lines))
    MATRICES.append("\n".join(lines))  # printed again at the end of every run (tests/e2e/conftest.py)


def _assert(results: Results, *, must_overrun: list[Cell], share: float = 0.75) -> None:
    overrun = sum(1 for cell in must_overrun if results[cell][0].failed)
    assert overrun >= share * len(must_overrun), (
        f"the bursts overran the backend in only {overrun} of {len(must_overrun)} cells: they prove nothing"
    )
    escaped = [f"{c.label()} model={c.model}" for c, (_, g) in results.items() if g.failed]
    assert not escaped, f"{len(escaped)} cells failed through kvgate (printed above), e.g. {escaped[:3]}"


@pytest.mark.parametrize("half", [0, 1])
async def test_simulated_llama_server_unified_pool_full_matrix(half: int) -> None:
    """The cells in two halves (every other cell), each a test of its own."""
    started = time.monotonic()
    cells = pairwise_cells(LLAMA_ROUTES, MATRIX_SEED)[half::2]
    async with (
        _sim(SIM_LLAMA_CONFIG) as direct,
        _sim(SIM_LLAMA_CONFIG) as behind,
        running_gateway([{"name": "ls", "kind": "llama-server", "url": behind}]) as gated,
    ):
        results, skipped = await _run_matrix(SIM_LLAMA, cells, direct, gated)
    _report(SIM_LLAMA, results, skipped, started, seed=MATRIX_SEED)
    # the two /v1/messages cells with n_predict beside max_tokens 16 are 0/0 by design (see above)
    _assert(results, must_overrun=[c for c in results if (c.route, c.limit) != ("/v1/messages", "small+n_predict")])


async def test_simulated_ollama_full_matrix() -> None:
    started = time.monotonic()
    async with (
        _sim(SIM_OLLAMA_CONFIG) as direct,
        _sim(SIM_OLLAMA_CONFIG) as behind,
        running_gateway([{"name": "ollama", "kind": "ollama", "url": behind}]) as gated,
    ):
        cells = pairwise_cells(OLLAMA_ROUTES, MATRIX_SEED)
        results, skipped = await _run_matrix(SIM_OLLAMA, cells, direct, gated, stats_urls=(direct, behind))
    _report(SIM_OLLAMA, results, skipped, started, seed=MATRIX_SEED)
    # Ollama refuses a made-up name (404) and a missing one (400): only the served name can overrun it, and not on
    # /v1/messages without a positive max_tokens (its 400, see above)
    _assert(results, must_overrun=[c for c in results if c.model == "served" and not (
        c.route == "/v1/messages" and c.limit in ("none", "negative"))])


@pytest.fixture(scope="module")
def tiny_fim_model() -> Path:
    return write_tiny_model(n_ctx_train=4096, vocab=VOCAB_DIR / "ggml-vocab-deepseek-coder.gguf")


@pytest.fixture(params=["unified", "split"])
def real_layout(
    request: pytest.FixtureRequest, llama_server_bin: Path, tiny_fim_model: Path
) -> Iterator[tuple[Target, RunningLlamaServer]]:
    target, args = (REAL_UNIFIED, ()) if request.param == "unified" else (REAL_SPLIT, ("-np", "4"))
    with run_llama_server(
        tiny_fim_model, "-c", "1024", "-t", "2", "-a", "tiny", *args, log_verbosity=1, binary=llama_server_bin
    ) as server:
        yield target, server


@pytest.mark.llama_server
async def test_real_llama_server_covering_matrix(real_layout: tuple[Target, RunningLlamaServer]) -> None:
    target, server = real_layout
    started = time.monotonic()
    cells = covering_cells(LLAMA_ROUTES, shift=0 if target is REAL_UNIFIED else 1)
    assert {c.model for c in cells} == set(MODELS) and len({c.limit for c in cells}) == 4
    async with running_gateway([{"name": "cpp", "kind": "llama-server", "url": server.url}]) as gated:
        results, skipped = await _run_matrix(target, cells, server.url, gated)
    _report(target, results, skipped, started)
    _assert(results, must_overrun=list(results))


SHAPES_CONFIG = SimConfig(
    mode="llama-server", server_model="phi3:mini", ctx_size=256, time_scale=10.0, prompt_tokens_per_s=500.0,
    gen_tokens_per_s=2000.0, min_response_tokens=5000, max_response_tokens=5000, embeddings=True, reranking=True,
)
SHAPES_TITLE = "simulated llama-server, -c 256, 4 slots on one unified pool, --embeddings --reranking: batch shapes"
BURST = 4


async def test_simulated_llama_server_batch_shapes_matrix() -> None:
    started = time.monotonic()
    cells = [(shape, stream) for shape in BATCH_SHAPES for stream in ((False, True) if shape.streams else (False,))]
    results: dict[tuple[Shape, bool], tuple[Tally, Tally]] = {}
    async with (
        _sim(SHAPES_CONFIG) as direct,
        _sim(SHAPES_CONFIG) as behind,
        running_gateway([{"name": "ls", "kind": "llama-server", "url": behind}]) as gated,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
    ):
        for shape, stream in cells:
            bodies = [shape_body(shape, stream, i, prompt_words=40, output_tokens=120, input_words=100)
                      for i in range(BURST)]
            straight = await burst(http, direct, shape.route, bodies, TIMEOUT_S)
            through = await burst(http, gated, shape.route, bodies, TIMEOUT_S)
            results[(shape, stream)] = (straight, through)
    lines = [render_shapes(SHAPES_TITLE, results)]
    escaped = [f"{shape.label(stream)}: {next(r for r in g.reasons if not r.startswith('refused'))}"
               for (shape, stream), (_, g) in results.items() if g.failed]
    if escaped:
        lines.append("through kvgate, failing cells (first reason):\n  " + "\n  ".join(escaped))
    lines.append(f"wall time: {time.monotonic() - started:.1f} s")
    print("\n" + "\n".join(lines))
    MATRICES.append("\n".join(lines))
    runnable = {cell: r for cell, r in results.items() if cell[0].name not in REFUSED_SHAPES}
    overrun = [cell for cell, (direct_tally, _) in runnable.items() if direct_tally.failed]
    assert len(overrun) == len(runnable), (
        f"the bursts overran the simulator in only {len(overrun)} of {len(runnable)} cells: they prove nothing")
    assert all(d.refused == BURST and g.refused == BURST for cell, (d, g) in results.items()
               if cell[0].name in REFUSED_SHAPES)  # both answer the server's own 400
    assert not escaped, f"{len(escaped)} cells failed through kvgate (printed above)"
    assert all(g.ok == BURST for cell, (_, g) in runnable.items()), "kvgate refused a shape the server could run"
