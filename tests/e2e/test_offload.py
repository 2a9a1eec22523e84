"""Issue 22 point 4: a load the backend would serve by offloading to the CPU is served through kvgate too.

kvgate in front of the simulated Ollama (E3: llama.cpp's fit on, ``llama_fit``), a foreign process holding 20 of
the 24 GiB, the simulator's GPU exporter as the ``vram`` source and a ``/proc/meminfo`` of our own (system RAM is
the host's; the tests must not depend on this machine's). ``residency.when_gpu_full`` decides: "offload" (the
default) loads it partly on the CPU, announced in ``X-Kvgate-Offload``; "wait" waits for GPU memory; "refuse"
answers 503 at once. With fit off (``llama_fit=False``, ``LLAMA_ARG_FIT=off``) the backend itself fails such a
load: ``cpu_offload = "off"`` says so, and on "auto" kvgate learns it from the first failure.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.loads.gate import LOAD_POLL_S
from tests.e2e.test_load_admission import GIB, backend_for, call, chat, foreign, resident, simulator, stats
from tests.support.gateway_server import running_gateway

MODEL = "llama3.1:8b"
OFFLOAD = re.compile(r"^(\d+) of (\d+) layers on the CPU \(system RAM \d+\.\d GiB\)$")


def meminfo(tmp_path: Path, available_gib: int = 96) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal: {128 * GIB // 1024} kB\nMemAvailable: {available_gib * GIB // 1024} kB\n"
                    "SwapTotal: 0 kB\nSwapFree: 0 kB\n")
    return str(path)


async def burst(url: str, n: int) -> list[tuple[int, dict[str, str], Any]]:
    return await asyncio.gather(*(chat(url, MODEL, options={"num_predict": 8}) for _ in range(n)))


async def test_the_issues_case_completes_12_of_12_through_kvgate_announced(tmp_path: Path) -> None:
    """A foreign process holds 20 of 24 GiB: straight at the simulator 12 of 12 requests complete, partly on the
    CPU; through kvgate (defaults, ``vram`` at the exporter) 12 of 12 too, each saying how much runs on the CPU,
    with one load and no failure on the simulator."""
    rows = []
    async with simulator() as sim:
        await foreign(sim, 20)
        started = time.monotonic()
        direct = await burst(sim, 12)
        rows.append(("direct", sum(s == 200 for s, _, _ in direct), time.monotonic() - started, "-",
                     (await stats(sim))["partial_offloads"]))
    async with simulator() as sim, running_gateway([backend_for(sim)],
                                                   residency={"meminfo_path": meminfo(tmp_path)}) as url:
        await foreign(sim, 20)
        started = time.monotonic()
        through = await burst(url, 12)
        sim_stats = await stats(sim)
        headers = {h.get("X-Kvgate-Offload", "") for _, h, _ in through}
        rows.append(("kvgate", sum(s == 200 for s, _, _ in through), time.monotonic() - started, " | ".join(headers),
                     sim_stats["partial_offloads"]))
        print("\n" + "\n".join(f"{who:7s} {ok:2d}/12 in {wall_s:5.2f} s  partial offloads {n}  {said}"
                               for who, ok, wall_s, said, n in rows))
        assert [s for s, _, _ in through] == [200] * 12, [b for s, _, b in through if s != 200][:1]
        assert len(headers) == 1 and OFFLOAD.match(headers.pop())
        assert (sim_stats["loads"], sim_stats["load_failures"], sim_stats["runtime_ooms"]) == (1, 0, 0)
        assert sim_stats["partial_offloads"] == 1 and set(await resident(sim)) == {MODEL}
    assert rows[0][1] == 12


async def test_wait_waits_for_gpu_memory_and_loads_on_the_gpu_when_it_is_freed(tmp_path: Path) -> None:
    """``when_gpu_full = "wait"``: the load waits while the foreign process holds the memory, and goes on, all on
    the GPU (no X-Kvgate-Offload), once it ends; without it ending, a 503 after ``load_wait_s`` that says so."""
    residency = {"when_gpu_full": "wait", "load_wait_s": 20.0, "meminfo_path": meminfo(tmp_path)}
    async with simulator() as sim, running_gateway([backend_for(sim)], residency=residency) as url:
        pid = await foreign(sim, 20)
        waiting = asyncio.ensure_future(chat(url, MODEL, options={"num_predict": 4}))
        await asyncio.sleep(3 * LOAD_POLL_S)  # kvgate polls every LOAD_POLL_S: 3 polls, it has decided to wait by now
        assert not waiting.done() and (await stats(sim))["loads"] == 0
        status, _, _ = await call(sim, "DELETE", f"/sim/processes/{pid}")
        assert status in (200, 204)
        status, headers, body = await waiting
        assert status == 200, body
        assert "X-Kvgate-Offload" not in headers
        assert (await stats(sim))["partial_offloads"] == 0
    residency["load_wait_s"] = 0.5
    async with simulator() as sim, running_gateway([backend_for(sim)], residency=residency) as url:
        await foreign(sim, 20)
        started = time.monotonic()
        status, headers, body = await chat(url, MODEL)
        print(f"\nwait, never freed: {status} after {time.monotonic() - started:.2f} s: {body['error'][-160:]}")
        assert status == 503 and "when_gpu_full = 'wait'" in body["error"] and "load_wait_s" in body["error"]
        assert int(headers["Retry-After"]) >= 1 and (await stats(sim))["loads"] == 0


@pytest.mark.parametrize("residency", [{"when_gpu_full": "refuse"}, {"allow_cpu_offload": False}],
                         ids=["refuse", "deprecated allow_cpu_offload = false"])
async def test_refuse_answers_503_at_once_and_the_backend_never_tries(
    tmp_path: Path, residency: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "gateway.app")
    async with simulator() as sim, running_gateway(
            [backend_for(sim)], residency={**residency, "meminfo_path": meminfo(tmp_path)}) as url:
        await foreign(sim, 20)
        status, _, body = await chat(url, MODEL)
        assert status == 503 and "when_gpu_full = 'refuse'" in body["error"], body
        assert (await stats(sim))["loads"] == 0
    deprecated = [r.getMessage() for r in caplog.records if "allow_cpu_offload is deprecated" in r.getMessage()]
    assert bool(deprecated) == ("allow_cpu_offload" in residency)


@pytest.mark.parametrize(("sim_changes", "cpu_offload", "offloaded"), [
    ({}, "auto", True),
    ({}, "off", False),
    ({"llama_fit": False}, "on", True),  # the operator's word: kvgate lets it spill, the backend fails (as direct)
    ({"era": "e2"}, "auto", False),  # Ollama 0.20: kvgate does not assume an offload
    ({"era": "e2"}, "on", False),  # ... and the simulated E2 never offloads: its load fails, kvgate learns
], ids=["e3-auto", "e3-off", "fit-off-but-on", "e2-auto", "e2-on"])
async def test_kvgate_offloads_only_where_the_backend_would(
    tmp_path: Path, sim_changes: dict[str, Any], cpu_offload: str, offloaded: bool
) -> None:
    """The backend's ``cpu_offload`` and version decide whether kvgate lets a load spill; where it does and the
    backend can't, the failure is the backend's (as straight at it), never a silent second try."""
    async with simulator(**sim_changes) as sim, running_gateway(
            [{**backend_for(sim), "cpu_offload": cpu_offload}], residency={"meminfo_path": meminfo(tmp_path)}) as url:
        await foreign(sim, 20)
        status, headers, body = await chat(url, MODEL)
        sim_stats = await stats(sim)
        print(f"\n{sim_changes or 'e3'} cpu_offload={cpu_offload}: {status} offload={headers.get('X-Kvgate-Offload')} "
              f"loads={sim_stats['loads']} failures={sim_stats['load_failures']}")
        if offloaded and sim_stats["load_failures"] == 0:
            assert status == 200 and OFFLOAD.match(headers["X-Kvgate-Offload"])
        elif offloaded or cpu_offload == "on":  # the backend can't: its load failed (once), then kvgate refuses
            assert status == 503 and sim_stats["load_failures"] >= 1 and sim_stats["loads"] == 0, body
            again = await chat(url, MODEL)
            assert again[0] == 503 and (await stats(sim))["load_failures"] == sim_stats["load_failures"]
        else:
            assert status == 503 and sim_stats["loads"] == sim_stats["load_failures"] == 0, body


async def test_on_auto_a_failed_spill_teaches_kvgate_the_backend_does_not_offload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ollama 0.30 with LLAMA_ARG_FIT=off, kvgate on "auto": the first load kvgate lets spill fails on the backend
    (its 500 is not relayed: the client gets kvgate's 503), the log says to set cpu_offload = "off", and no later
    request makes the backend try again."""
    caplog.set_level(logging.WARNING, logger="gateway.loads.gate")
    async with simulator(llama_fit=False) as sim, running_gateway(
            [backend_for(sim)], residency={"meminfo_path": meminfo(tmp_path)}) as url:
        await foreign(sim, 20)
        first = await chat(url, MODEL)
        failures = (await stats(sim))["load_failures"]  # Ollama retries an OOM once itself, at a lower tier
        second = await chat(url, MODEL, path="/v1/chat/completions")
        sim_stats = await stats(sim)
    assert (first[0], second[0]) == (503, 503), (first[2], second[2])
    assert failures >= 1 and sim_stats["load_failures"] == failures and sim_stats["loads"] == 0
    assert "not loaded partly on the CPU: a load kvgate let run partly on the CPU failed" in second[2]["error"][
        "message"]
    assert any('cpu_offload = "off"' in r.getMessage() for r in caplog.records)


async def test_a_v1_request_at_a_default_too_big_for_the_gpu_is_offloaded(tmp_path: Path) -> None:
    """qwen2.5:32b loaded at a lowered context; a /v1 request (no num_ctx) makes Ollama reload it at its default
    32768, which does not fit the GPU: Ollama would load it partly on the CPU, so kvgate does, and says so."""
    async with simulator() as sim, running_gateway([backend_for(sim)],
                                                   residency={"meminfo_path": meminfo(tmp_path)}) as url:
        status, headers, _ = await chat(url, "qwen2.5:32b")
        assert status == 200 and "X-Kvgate-Context-Lowered" in headers
        # llama.cpp's fit keeps 1 GiB free where kvgate's headroom is 512 MiB: the backend itself spills a little,
        # and the header says so from /api/ps
        assert headers.get("X-Kvgate-Offload", "of the model on the CPU (Ollama's /api/ps)").endswith(
            "of the model on the CPU (Ollama's /api/ps)")
        status, headers, body = await chat(url, "qwen2.5:32b", path="/v1/chat/completions")
        assert status == 200, body
        assert OFFLOAD.match(headers["X-Kvgate-Offload"]) and "X-Kvgate-Context-Lowered" not in headers
        assert (await resident(sim)) == {"qwen2.5:32b": 32768}
        assert (await stats(sim))["load_failures"] == 0
