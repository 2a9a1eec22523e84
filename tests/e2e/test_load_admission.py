"""Issue 12, points 2-4, end to end: model loads admitted against the simulated 24 GiB GPU.

kvgate in front of the simulated Ollama, with the simulator's GPU exporter as the ``vram`` source. Each test reads
the simulator's own counters (/sim/stats: loads, unloads, load failures for lack of memory, runtime OOMs) as the
truth, beside what the client got. Sizes on the simulated GPU: llama3.1:8b ~4.6 GiB of weights (8.8 GiB at its
default 32768 context), qwen2.5:32b ~18.5 GiB (does not fit at 32768), gemma3:27b ~19 GiB at 32768.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.kvsim.helpers import running_sim
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

GIB = 1 << 30
FAST = {"load_s": 0.01, "time_scale": 50.0}
MODELS = ("llama3.1:8b", "qwen2.5:32b", "gemma3:27b", "llama3.1:70b")


@contextlib.asynccontextmanager
async def simulator(**changes: Any) -> AsyncIterator[str]:
    from kvsim.config import SimConfig

    async with running_sim(SimConfig(**{"models": MODELS, **FAST, **changes})) as url:
        yield url


def backend_for(sim: str) -> dict[str, Any]:
    from kvsim.gpu.exporter import EXPORTER_PATH

    return {"name": "sim", "url": sim, "vram": sim + EXPORTER_PATH, "vram_refresh_s": 0.01, "parallel": 1}


async def call(url: str, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as http, http.request(method, f"{url}{path}", json=body) as response:
        raw = await response.read()
        return response.status, dict(response.headers), orjson.loads(raw) if raw else None


async def chat(url: str, model: str, *, path: str = "/api/chat", **extra: Any) -> tuple[int, dict[str, str], Any]:
    body = {"model": model, "stream": False, "messages": [{"role": "user", "content": "hi"}], **extra}
    return await call(url, "POST", path, body)


async def stats(sim: str) -> dict[str, Any]:
    return (await call(sim, "GET", "/sim/stats"))[2]  # type: ignore[no-any-return]


async def resident(sim: str) -> dict[str, int]:
    """Model -> context, as /api/ps shows them."""
    ps = (await call(sim, "GET", "/api/ps"))[2]
    return {m["name"]: m["context_length"] for m in ps["models"]}


async def foreign(sim: str, gib: int) -> int:
    status, _, body = await call(sim, "POST", "/sim/processes", {"name": "trainer", "bytes": gib * GIB})
    assert status in (200, 201), body
    return int(body["pid"])


async def test_a_load_that_cannot_fit_is_refused_with_the_numbers_not_relayed_as_a_cuda_oom() -> None:
    """The issue's reproduction: a foreign process holds 20 GiB of the 24; straight at Ollama the load fails with
    500 cudaMalloc; through kvgate it is a 503 naming the model, the bytes needed and free, with Retry-After, in each
    client's format, and the simulator never tried the load."""
    async with simulator(llama_fit=False) as sim:  # LLAMA_ARG_FIT=off: no partial offload to the CPU
        await foreign(sim, 20)
        status, _, body = await chat(sim, "llama3.1:8b")
        assert status == 500 and "cudaMalloc failed" in body["error"]
        direct_failures = (await stats(sim))["load_failures"]
        async with running_gateway([{**backend_for(sim), "cpu_offload": "off"}]) as url:
            rows = []
            for path, model_path in (("/api/chat", None), ("/v1/chat/completions", ("error", "message"))):
                status, headers, body = await chat(url, "llama3.1:8b", path=path)
                message = body["error"] if model_path is None else body["error"]["message"]
                rows.append((path, status, headers.get("Retry-After"), message[:90]))
                assert status == 503, body
                assert int(headers["Retry-After"]) >= 1
                assert "'llama3.1:8b'" in message and "bytes of GPU memory" in message and "free" in message
                if model_path is not None:
                    assert body["error"]["code"] == "gpu_memory_exhausted"
            print("\n" + "\n".join(f"{p:24s} {s} Retry-After={r} {m}" for p, s, r, m in rows))
        assert (await stats(sim))["load_failures"] == direct_failures  # kvgate never let Ollama try
        assert await resident(sim) == {}


async def test_the_context_is_lowered_to_the_largest_that_fits_and_announced() -> None:
    """qwen2.5:32b at its default 32768 context does not fit 24 GiB; kvgate loads it at the largest context that
    does (a multiple of 256, above the floor), says so in a header, and pins requests to it. With
    ``when_gpu_full = "refuse"``, a /v1 request that would reload it at the default is refused (by default it is
    loaded partly on the CPU instead: test_a_v1_request_at_a_default_too_big_for_the_gpu_is_offloaded)."""
    async with simulator() as sim, running_gateway([backend_for(sim)],
                                                   residency={"when_gpu_full": "refuse"}) as url:
        status, headers, body = await chat(url, "qwen2.5:32b")
        assert status == 200, body
        loaded = (await resident(sim))["qwen2.5:32b"]
        assert 2048 <= loaded < 32768 and loaded % 256 == 0
        assert headers["X-Kvgate-Context-Lowered"] == f"{loaded} (asked 32768; GPU memory)"
        assert f"options.num_ctx={loaded}" in headers["X-Kvgate-Rewrite"]
        status, headers, _ = await chat(url, "qwen2.5:32b")  # later requests: same pool, same header, no reload
        assert status == 200 and headers["X-Kvgate-Context-Lowered"].startswith(str(loaded))
        sim_stats = await stats(sim)
        assert (sim_stats["loads"], sim_stats["load_failures"], sim_stats["runtime_ooms"]) == (1, 0, 0)
        # /v1 can't carry num_ctx: Ollama would reload the model at its default (32768), which does not fit
        status, headers, body = await chat(url, "qwen2.5:32b", path="/v1/chat/completions")
        assert status == 503 and body["error"]["code"] == "gpu_memory_exhausted", body
        assert "/api/chat" in body["error"]["message"] and "OLLAMA_CONTEXT_LENGTH" in body["error"]["message"]
        assert await resident(sim) == {"qwen2.5:32b": loaded}
        assert (await stats(sim))["loads"] == 1


async def test_a_v1_request_reloads_a_lowered_model_at_the_default_once_it_fits() -> None:
    """A context lowered because a foreign process held memory: once it is gone, a /v1 request (which runs at
    Ollama's default context) makes kvgate reload the model at the default itself, through the GPU check."""
    async with simulator() as sim, running_gateway([backend_for(sim)]) as url:
        pid = await foreign(sim, 17)
        status, headers, _ = await chat(url, "llama3.1:8b")
        lowered = (await resident(sim))["llama3.1:8b"]
        assert status == 200 and lowered < 32768 and "X-Kvgate-Context-Lowered" in headers
        assert (await call(sim, "DELETE", f"/sim/processes/{pid}"))[0] in (200, 204)
        status, headers, body = await chat(url, "llama3.1:8b", path="/v1/chat/completions")
        assert status == 200, body
        assert "X-Kvgate-Context-Lowered" not in headers
        assert await resident(sim) == {"llama3.1:8b": 32768}
        sim_stats = await stats(sim)
        assert (sim_stats["loads"], sim_stats["load_failures"], sim_stats["runtime_ooms"]) == (2, 0, 0)


async def test_idle_models_are_unloaded_least_recently_used_first_and_a_pinned_one_never() -> None:
    async with simulator() as sim, running_gateway(
        [backend_for(sim)], residency={"min_resident_s": 0.0},
        models={"gemma3:27b": {"pin": True}},
    ) as url:
        assert (await chat(url, "llama3.1:8b"))[0] == 200
        assert (await chat(url, "gemma3:27b"))[0] == 200  # 8.8 + 19 GiB don't fit: llama goes
        assert set(await resident(sim)) == {"gemma3:27b"}
        status, _, body = await chat(url, "llama3.1:8b")  # gemma is pinned: llama can't come back at 32768
        loaded = await resident(sim)
        print(f"\nllama after pinned gemma: {status}, resident {loaded}")
        assert "gemma3:27b" in loaded  # never unloaded
        if status == 200:  # at a lowered context beside it
            assert loaded["llama3.1:8b"] < 32768
        else:
            assert status == 503 and "llama3.1:8b" in body["error"]
        sim_stats = await stats(sim)
        assert (sim_stats["load_failures"], sim_stats["runtime_ooms"]) == (0, 0)


async def test_least_recently_used_goes_first() -> None:
    async with simulator(gpu_bytes=(32 * GIB,)) as sim, running_gateway(
        [{**backend_for(sim), "context_tokens": 8192}], residency={"min_resident_s": 0.0},
    ) as url:
        for model in ("llama3.1:8b", "gemma3:27b", "llama3.1:8b"):  # gemma is now the least recently used
            assert (await chat(url, model))[0] == 200
        assert set(await resident(sim)) == {"llama3.1:8b", "gemma3:27b"}
        assert (await chat(url, "qwen2.5:32b"))[0] == 200  # 18.5 GiB more: one of them must go
        assert set(await resident(sim)) == {"llama3.1:8b", "qwen2.5:32b"}
        sim_stats = await stats(sim)
        assert (sim_stats["load_failures"], sim_stats["runtime_ooms"]) == (0, 0)
        assert (sim_stats["loads"], sim_stats["unloads"]) == (3, 1)
        gpu = (await call(url, "GET", "/kvgate/status"))[2]["gpus"][0]
        assert gpu["loads"] == {"loads": 3, "unloads": 1, "lowered": 0, "waited": 0, "refused": 0}
        async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/metrics") as response:
            text = await response.text()
        assert 'kvgate_model_loads_total{backend="sim"} 3.0' in text
        assert 'kvgate_model_unloads_total{backend="sim"} 1.0' in text


async def test_concurrent_requests_for_two_models_that_do_not_fit_together_never_start_both_loads() -> None:
    """Straight at the simulator, streams for two big models at once: the second load evicts or fails. Through
    kvgate the loads are serialised and each waits for the other's requests to end: no load failure, no OOM."""
    async with simulator() as sim, running_gateway([backend_for(sim)], residency={"min_resident_s": 0.0,
                                                                                 "load_wait_s": 20.0}) as url:
        results = await asyncio.gather(*(chat(url, model, options={"num_predict": 32})
                                         for model in ("qwen2.5:32b", "gemma3:27b") * 3))
        statuses = [status for status, _, _ in results]
        sim_stats = await stats(sim)
        print(f"\nstatuses {statuses}; simulator: loads {sim_stats['loads']}, unloads {sim_stats['unloads']}, "
              f"load failures {sim_stats['load_failures']}, runtime OOMs {sim_stats['runtime_ooms']}")
        assert statuses == [200] * 6
        assert (sim_stats["load_failures"], sim_stats["runtime_ooms"]) == (0, 0)
        assert sim_stats["loads"] <= 6


async def test_an_overcommitted_gpu_is_shown_and_new_loads_wait_then_are_refused() -> None:
    """A foreign process takes memory a resident model needs: the status page and the gauge say over-committed, and
    a load of another model waits (``load_wait_s``) and is refused rather than started."""
    async with simulator() as sim, running_gateway([backend_for(sim)], residency={"load_wait_s": 0.5}) as url:
        assert (await chat(url, "gemma3:27b"))[0] == 200
        await foreign(sim, 8)  # 19 GiB resident + 8 GiB foreign > 24 GiB

        async def overcommitted() -> dict[str, Any] | None:
            gpu: dict[str, Any] = (await call(url, "GET", "/kvgate/status"))[2]["gpus"][0]
            return gpu if gpu["overcommitted"] else None

        gpu = await until(overcommitted)
        assert gpu["other_processes_bytes"] == 8 * GIB
        async with aiohttp.ClientSession() as http, http.get(f"{url}/kvgate/metrics") as response:
            assert 'kvgate_gpu_overcommitted{backend="sim"} 1.0' in await response.text()
        status, headers, body = await chat(url, "llama3.1:8b")
        assert status == 503 and "over-committed" in body["error"] and "waited 0.5 s" in body["error"]
        assert int(headers["Retry-After"]) >= 1
        assert set(await resident(sim)) == {"gemma3:27b"}


@pytest.mark.parametrize("enabled", [True, False])
async def test_residency_can_be_turned_off(enabled: bool) -> None:
    async with simulator(llama_fit=False) as sim, running_gateway([backend_for(sim)],
                                                                  residency={"enabled": enabled}) as url:
        await foreign(sim, 20)
        status, _, _ = await chat(url, "llama3.1:8b")
        assert status == (503 if enabled else 500)  # off: Ollama's own failure comes back, as before


def _meminfo(tmp_path: Any, available_gib: int, swap_free_gib: int = 0) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal: {128 * GIB // 1024} kB\nMemAvailable: {available_gib * GIB // 1024} kB\n"
                    f"SwapTotal: {swap_free_gib * GIB // 1024} kB\nSwapFree: {swap_free_gib * GIB // 1024} kB\n")
    return str(path)


@pytest.mark.parametrize(("available_gib", "swap_gib", "expected"), [
    (96, 0, "loads partly on the CPU"), (20, 64, "swap"), (8, 0, "OOM killer"),
], ids=["fits", "would_swap", "would_oom"])
async def test_cpu_offload_is_allowed_only_when_system_ram_holds_it(
    tmp_path: Any, available_gib: int, swap_gib: int, expected: str
) -> None:
    """llama3.1:70b (~40 GiB) can't fit the 24 GiB GPU at any context: with ``allow_cpu_offload`` it loads partly on
    the CPU when /proc/meminfo (a file here) says system RAM holds the rest; otherwise 503, naming swap or the OOM
    killer, and Ollama never tries."""
    residency = {"allow_cpu_offload": True, "meminfo_path": _meminfo(tmp_path, available_gib, swap_gib)}
    async with simulator() as sim, running_gateway([backend_for(sim)], residency=residency) as url:
        status, _, body = await chat(url, "llama3.1:70b")
        sim_stats = await stats(sim)
        print(f"\nRAM available {available_gib} GiB, swap {swap_gib} GiB: {status} "
              f"{'' if status == 200 else body['error'][:200]}")
        if expected == "loads partly on the CPU":
            assert status == 200, body
            assert set(await resident(sim)) == {"llama3.1:70b"}
        else:
            assert status == 503 and expected in body["error"] and "system RAM" in body["error"]
            assert sim_stats["loads"] == 0
        assert (sim_stats["load_failures"], sim_stats["runtime_ooms"]) == (0, 0)


async def test_two_users_taking_turns_swap_at_most_once_per_min_resident_s() -> None:
    """Two users alternate between two models that don't fit together, as fast as they can, for WINDOW_S: with
    hysteresis (``min_resident_s``) the GPU swaps at most once per interval, and every request is answered."""
    window_s, min_resident_s = 0.5, 0.125
    big, small = "qwen2.5:32b", "llama3.1:8b"  # ~19 + ~5 GiB at 4096 tokens: not both on 20 GiB
    async with simulator(models=(big, small), gpu_bytes=(20 * GIB,)) as sim, running_gateway(
        [{**backend_for(sim), "context_tokens": 4096}], residency={"min_resident_s": min_resident_s,
                                                                   "load_wait_s": 10.0}) as url:
        for model in (big, small):  # each loaded and counted once before the window: it measures swaps only
            assert (await chat(url, model, options={"num_predict": 4}))[0] == 200
        before = await stats(sim)
        loop = asyncio.get_running_loop()
        end_s = loop.time() + window_s
        statuses: list[int] = []

        async def user(model: str, other: str) -> None:
            turn = 0
            while loop.time() < end_s:
                statuses.append((await chat(url, (model, other)[turn % 2], options={"num_predict": 4}))[0])
                turn += 1

        await asyncio.gather(user(big, small), user(small, big))
        elapsed_s = window_s + max(0.0, loop.time() - end_s)
        sim_stats = await stats(sim)
        loads = sim_stats["loads"] - before["loads"]
        bound = int(elapsed_s / min_resident_s) + 1  # one swap per interval, and one at its edge
        print(f"\n{len(statuses)} requests in {elapsed_s:.2f} s: simulator loads {loads}, unloads "
              f"{sim_stats['unloads'] - before['unloads']} (bound {bound}), statuses {sorted(set(statuses))}")
        assert set(statuses) == {200} and loads >= 1  # every request answered; the GPU did swap
        assert loads <= bound
        assert (sim_stats["load_failures"], sim_stats["runtime_ooms"]) == (0, 0)
