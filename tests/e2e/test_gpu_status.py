"""The GPU ledger end to end: /kvgate/status ``gpus`` and the kvgate_gpu_* gauges, against the simulated GPU."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

GIB = 1 << 30


async def _get(url: str, path: str, accept: str = "application/json") -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}{path}", headers={"Accept": accept}) as response:
        return response.status, await response.read()


async def _gauges(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """kvgate_gpu_* samples of /kvgate/metrics by (name, sorted labels)."""
    _, text = await _get(url, "/kvgate/metrics")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text.decode()) if family.name.startswith("kvgate_gpu_")
            for sample in family.samples}


async def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}{path}", json=body) as response:
        assert response.status in (200, 201), await response.text()
        reply: dict[str, Any] = orjson.loads(await response.read())
        return reply


async def test_status_and_metrics_show_the_gpu_ledger_of_the_simulated_gpu() -> None:
    from kvsim.config import SimConfig
    from kvsim.gpu.exporter import EXPORTER_PATH
    from kvsim.runner import start_sim

    runner, sim = await start_sim(SimConfig(models=("llama3.1:8b",), load_s=0.01, time_scale=50.0))
    backend = {"name": "sim", "url": sim, "vram": sim + EXPORTER_PATH, "vram_refresh_s": 0.01, "parallel": 1}
    try:
        async with running_gateway([backend]) as url:
            await _post(sim, "/api/generate", {"model": "llama3.1:8b", "prompt": "", "options": {"num_ctx": 8192}})
            await _post(sim, "/sim/processes", {"name": "trainer", "bytes": 3 * GIB})
            ps = orjson.loads((await _get(sim, "/api/ps"))[1])
            size_vram = ps["models"][0]["size_vram"]
            assert size_vram > 4 * GIB  # weights (~4.6 GiB) + 1 GiB KV + compute

            async def settled() -> dict[str, Any] | None:  # once the cached reading shows the trainer
                status, body = await _get(url, "/kvgate/status")
                assert status == 200
                gpu: dict[str, Any] = orjson.loads(body)["gpus"][0]
                return gpu if gpu["other_processes_bytes"] == 3 * GIB else None

            gpu = await until(settled)
            assert gpu["backend"] == "sim" and gpu["source"] == "exporter" and gpu["problem"] is None
            assert gpu["total_bytes"] == 24 * GIB
            assert [(d["index"], d["total_bytes"], d["used_bytes"]) for d in gpu["per_device"]] == [
                (0, 24 * GIB, gpu["used_bytes"])]
            assert [(m["name"], m["resident_bytes"], m["source"]) for m in gpu["models"]] == [
                ("llama3.1:8b", size_vram, "reported")]
            assert gpu["reserved_bytes"] == 0 and gpu["overcommitted"] is False
            assert gpu["free_bytes"] == 24 * GIB - size_vram - 3 * GIB

            sim_label = (("backend", "sim"),)
            assert await _gauges(url) == {
                ("kvgate_gpu_total_bytes", sim_label): 24 * GIB,
                ("kvgate_gpu_model_bytes", (*sim_label, ("model", "llama3.1:8b"))): size_vram,
                ("kvgate_gpu_other_processes_bytes", sim_label): 3 * GIB,
                ("kvgate_gpu_reserved_bytes", sim_label): 0,
                ("kvgate_gpu_free_bytes", sim_label): gpu["free_bytes"],
                ("kvgate_gpu_overcommitted", sim_label): 0,
            }
            _, page = await _get(url, "/kvgate/status", accept="text/html")
            assert b"<h2>GPUs</h2>" in page and b"llama3.1:8b: " in page
    finally:
        await runner.cleanup()


async def test_an_unreadable_gpu_shows_its_reason_and_never_fails_the_page() -> None:
    async with running(FakeLLM()) as fake, running_gateway([
        {"name": "down", "url": fake.url, "vram": "http://127.0.0.1:9/metrics"},
        {"name": "static", "url": fake.url, "vram": "24GiB"},
        {"name": "none", "url": fake.url},
    ]) as url:
        status, body = await _get(url, "/kvgate/status")
        assert status == 200
        gpus = {gpu["backend"]: gpu for gpu in orjson.loads(body)["gpus"]}
        assert set(gpus) == {"down", "static"}
        assert gpus["down"]["problem"].startswith("no VRAM reading") and "total_bytes" not in gpus["down"]
        static = gpus["static"]
        assert static["total_bytes"] == 24 * GIB and static["used_bytes"] == 0
        assert static["free_bytes"] == 24 * GIB - static["resident_bytes"]  # the fake's /api/ps reports 1 byte
        gauges = await _gauges(url)
        assert ("kvgate_gpu_total_bytes", (("backend", "static"),)) in gauges
        assert ("kvgate_gpu_total_bytes", (("backend", "down"),)) not in gauges


@pytest.mark.parametrize(("sim_changes", "backend_changes"), [
    ({}, {}),  # -c 4096, -np auto: four slots on one unified pool (kvgate's default reading of /props)
    ({"n_parallel": 2}, {"unified_kv": False}),  # -c 4096 -np 2: two split slots of 2048 cells
], ids=["unified", "split"])
async def test_a_llama_servers_model_shows_as_estimated_beside_a_foreign_process(
    sim_changes: dict[str, Any], backend_changes: dict[str, Any]
) -> None:
    from kvsim.config import SimConfig
    from kvsim.gpu.exporter import EXPORTER_PATH
    from kvsim.runner import start_sim

    config = SimConfig(mode="llama-server", server_model="phi3:mini", ctx_size=4096, **sim_changes)
    runner, sim = await start_sim(config)
    backend = {"name": "cpp", "kind": "llama-server", "url": sim, "vram": sim + EXPORTER_PATH,
               "vram_refresh_s": 0.01, **backend_changes}
    try:
        async with running_gateway([backend]) as url:
            await _post(sim, "/sim/processes", {"name": "trainer", "bytes": 3 * GIB})
            simulated = orjson.loads((await _get(sim, "/sim/gpu"))[1])
            server_bytes = next(p["used_bytes"] for p in simulated["processes"] if not p["foreign"])

            async def settled() -> dict[str, Any] | None:  # once the cached reading shows the trainer
                status, body = await _get(url, "/kvgate/status")
                assert status == 200
                gpu: dict[str, Any] = orjson.loads(body)["gpus"][0]
                return gpu if gpu["used_bytes"] == simulated["devices"][0]["used_bytes"] else None

            gpu = await until(settled)
            assert gpu["backend"] == "cpp" and gpu["source"] == "exporter" and gpu["problem"] is None
            [model] = gpu["models"]
            print(f"simulator: {server_bytes} bytes; kvgate's estimate: {model['resident_bytes']} bytes "
                  f"(weights {model['weights_bytes']}, KV {model['kv_bytes']}, compute {model['compute_bytes']})")
            assert (model["name"], model["source"]) == ("phi3:mini", "estimated")
            assert abs(model["resident_bytes"] - server_bytes) <= 0.1 * server_bytes
            assert model["weights_bytes"] + model["kv_bytes"] + model["compute_bytes"] <= model["resident_bytes"]
            assert gpu["resident_bytes"] == model["resident_bytes"]
            assert gpu["other_processes_bytes"] == gpu["used_bytes"] - model["resident_bytes"]
            assert abs(gpu["other_processes_bytes"] - 3 * GIB) <= 0.1 * server_bytes  # the trainer, give or take
            assert gpu["free_bytes"] == gpu["total_bytes"] - gpu["used_bytes"]
    finally:
        await runner.cleanup()


async def test_a_llama_servers_model_of_unknown_size_is_left_out_with_the_reason() -> None:
    async with running(FakeLLM()) as fake, running_gateway([
        {"name": "cpp", "kind": "llama-server", "url": fake.url, "vram": "24GiB"},  # no shape: no GGUF, no preset
    ]) as url:
        status, body = await _get(url, "/kvgate/status")
        assert status == 200
        [gpu] = orjson.loads(body)["gpus"]
        print(gpu["problem"])
        assert gpu["problem"].startswith("model size unknown: fake.gguf: ")
        assert gpu["models"] == [] and gpu["total_bytes"] == 24 * GIB and gpu["free_bytes"] == 24 * GIB
