"""Issue 23, point 4e: a CUDA out-of-memory at load, after kvgate admitted the load, becomes a fresh GPU reading, one
retry where that reading shows room, else 503 ``gpu_memory_exhausted`` with Retry-After in the route's own format;
never the backend's raw 500.

kvgate in front of the simulated Ollama (24 GiB GPU, ``llama_fit`` off: no spill to the CPU). The attack: a foreign
process that starts right after kvgate admitted a load; the runner then fails with ``CUDA error: out of memory``
and, before the fix, the client got that 500 as it was."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.e2e.test_load_admission import backend_for, chat, foreign, simulator, stats
from tests.support.gateway_server import running_gateway
from tests.support.poll import until


def _message(path: str, body: Any) -> str:
    return str(body["error"] if path.startswith("/api/") else body["error"]["message"])


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
async def test_a_foreign_process_after_an_admitted_load_is_a_503_not_a_raw_500(path: str) -> None:
    async with simulator(llama_fit=False, load_s=1.0, time_scale=1.0) as sim, \
            running_gateway([{**backend_for(sim), "cpu_offload": "off"}]) as url:
        answer = asyncio.ensure_future(chat(url, "llama3.1:8b", path=path))

        async def load_under_way() -> bool:  # kvgate's GPU check passed; the simulator loads for load_s
            return bool((await stats(sim))["loads"] >= 1)

        await until(load_under_way)
        await foreign(sim, 20)
        status, headers, body = await answer
        counted = await stats(sim)
    print(f"\n{path}: {status} Retry-After={headers.get('Retry-After')} {_message(path, body)[:140]}"
          f"\n  sim: loads {counted['loads']}, runtime OOMs {counted['runtime_ooms']}, load failures "
          f"{counted['load_failures']}")
    assert counted["runtime_ooms"] == 1  # the backend really ran out of memory
    assert status == 503, body  # before the fix: 500 'CUDA error: out of memory', as the backend said it
    assert int(headers["Retry-After"]) >= 1
    message = _message(path, body)
    assert "out of memory" in message and "'llama3.1:8b'" in message
    if path.startswith("/v1/"):
        assert body["error"]["code"] == "gpu_memory_exhausted"
    assert counted["loads"] == 1  # the fresh reading showed no room: no second try


async def test_an_out_of_memory_at_load_is_retried_once_where_the_reading_shows_room_then_refused() -> None:
    """A ``vram`` source that can't see the foreign process (a static size) says there is room; Ollama's load fails
    with ``cudaMalloc failed: out of memory``; kvgate reads the GPU again (room, it says), tries once more, and
    answers 503 ``gpu_memory_exhausted`` when that fails too."""
    async with simulator(llama_fit=False) as sim, running_gateway(
            [{**backend_for(sim), "vram": "24GiB", "cpu_offload": "off"}],
            admission={"probe_wait_s": 2.0}) as url:
        await foreign(sim, 20)
        assert (await chat(sim, "llama3.1:8b"))[0] == 500  # straight at Ollama: one load (it retries it itself)
        per_load = (await stats(sim))["load_failures"]
        status, headers, body = await chat(url, "llama3.1:8b", path="/v1/chat/completions")
        counted = await stats(sim)
    print(f"\nload OOM: {status} Retry-After={headers.get('Retry-After')} {body['error']['message'][:140]}"
          f"\n  sim: load failures {counted['load_failures']}")
    assert status == 503 and body["error"]["code"] == "gpu_memory_exhausted", body  # before: another 503 code
    assert int(headers["Retry-After"]) >= 1
    assert counted["load_failures"] == 3 * per_load  # the direct one; through kvgate the load and one retry
