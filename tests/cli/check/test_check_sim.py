"""``kvgate check`` end to end against the simulated Ollama and llama-server (kvsim), each in a state that produces
one finding or signature; the check runs in process, its ``--json`` output is parsed."""

from __future__ import annotations

import asyncio
import json
import tarfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.cli.check import command as check_cli
from gateway.cli.check.readings import HostReadings
from gateway.cli.main import build_parser
from gateway.memory.host_ram import HostRam
from kvsim.config import SimConfig
from kvsim.gpu.vgpu import GIB
from tests.kvsim.helpers import fast, post, running_sim
from tests.support.gateway_server import running_gateway
from tests.tokens.vocab_vectors import warm_sim_tokenizers

HEALTHY_HOST = HostReadings(ram=HostRam(64 * GIB, 48 * GIB, 8 * GIB, 8 * GIB), kernel_source="dmesg")


@pytest.fixture(scope="module", autouse=True)
def warm_tokenizers() -> None:
    """The simulator's tokenizers, converted in setup (once per process), not inside the first test."""
    warm_sim_tokenizers("llama3.1:8b", "qwen2.5:7b")


def sim(**changes: Any) -> SimConfig:
    return fast(tokenizer_cache_dir=warm_sim_tokenizers(), **changes)


def _host(**_: Any) -> HostReadings:
    return HEALTHY_HOST


async def check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, dict[str, Any]]]:
    args = build_parser().parse_args(["check", "--json", *argv])
    code = await check_cli.run(args, host_reader=_host)
    report = json.loads(capsys.readouterr().out)
    return code, {f["code"]: f for f in report["findings"]}


async def load(url: str, model: str, num_ctx: int) -> tuple[int, Any]:
    async with aiohttp.ClientSession(url) as session:
        return await post(session, "/api/generate", {"model": model, "options": {"num_ctx": num_ctx}})


async def test_foreign_process_is_found_and_named_with_ollama_gpu_overhead(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim(sim()) as url:
        async with aiohttp.ClientSession(url) as session:
            status, _ = await post(session, "/sim/processes", {"name": "trainer", "bytes": 6 * GIB})
        assert status == 201
        assert (await load(url, "llama3.1:8b", 4096))[0] == 200
        code, found = await check(capsys, "--backend", f"ollama={url}", "--vram", f"{url}/sim/metrics",
                                  "--prompt-tokens", "3000")
    foreign = found["foreign_gpu_process"]
    assert foreign["severity"] == "warning" and foreign["data"]["held_bytes"] >= 6 * GIB
    assert foreign["alternatives"][0]["setting"] == "OLLAMA_GPU_OVERHEAD"
    assert found["context_allocated"]["data"]["num_ctx"] == 4096
    assert code == 1


async def test_context_too_large_for_free_vram_names_a_context_that_fits(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim(sim(gpu_bytes=(12 * GIB,), num_parallel=2)) as url:
        assert (await load(url, "llama3.1:8b", 65536))[0] == 200
        code, found = await check(capsys, "--backend", f"ollama={url}", "--vram", f"{url}/sim/metrics")
    finding = found["context_too_large"]
    assert finding["severity"] == "critical" and code == 2
    suggested = finding["data"]["suggested_num_ctx"]
    assert finding["fix"]["setting"] == "OLLAMA_CONTEXT_LENGTH" and finding["fix"]["value"] == str(suggested)
    assert 1024 <= suggested < 65536
    assert finding["data"]["parallel"] == 2  # OLLAMA_NUM_PARALLEL, read from the /api/ps size as serve reads it


async def test_too_many_models_resident(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim(sim(gpu_bytes=(16 * GIB,))) as url:
        for model in ("llama3.1:8b", "qwen2.5:7b"):
            assert (await load(url, model, 16384))[0] == 200
        _, found = await check(capsys, "--backend", f"ollama={url}", "--vram", f"{url}/sim/metrics")
    finding = found.get("too_many_models") or found["models_resident"]
    assert finding["data"]["resident"] == 2
    if "too_many_models" in found:
        assert finding["fix"] == {"setting": "OLLAMA_MAX_LOADED_MODELS", "value": "1",
                                  "where": finding["fix"]["where"]}


async def test_load_oom_message_from_the_simulator_is_its_signature(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim(sim(gpu_bytes=(8 * GIB,), era="e2", llama_fit=False)) as url:
        status, body = await load(url, "llama3.1:8b", 131072)
        assert status == 500
        _, found = await check(capsys, "--backend", f"ollama={url}", "--error", body["error"])
    assert "signature:runner_terminated" in found, body
    assert found["signature:runner_terminated"]["fix"]["setting"] == "OLLAMA_CONTEXT_LENGTH"


async def test_llama_server_unified_pool_and_prompt_too_long(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "kvgate.toml"
    async with running_sim(sim(mode="llama-server", ctx_size=8192)) as url:
        config.write_text(f'[[backends]]\nname = "cpp"\nkind = "llama-server"\nurl = "{url}"\nunified_kv = true\n')
        async with aiohttp.ClientSession(url) as session:
            status, body = await post(session, "/completion", {"prompt": "hello " * 9000, "n_predict": 4})
        assert status == 400
        _, found = await check(capsys, "--config", str(config), "--error", json.dumps(body))
    pool = found["unified_pool"]
    assert pool["data"] == {"slots": 4, "slot_context_tokens": 8192, "unified": True, "pool_tokens": 8192}
    assert pool["fix"]["setting"].startswith("-np") and "-no-kvu" in pool["fix"]["value"]
    assert found["signature:prompt_exceeds_slot"]["fix"]["setting"] == "-c"


async def test_llama_server_layout_unknown_without_log_or_config(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim(sim(mode="llama-server", ctx_size=4096)) as url:
        _, found = await check(capsys, "--backend", f"llama-server={url}")
    assert found["pool_layout_unknown"]["severity"] == "info"


async def test_report_bundle_holds_no_secret(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    secrets = ["backend-key-Zq81", "admin-key-Lw72", "tenant-key-Pp09"]
    config = tmp_path / "kvgate.toml"
    report = tmp_path / "bundle.tar.gz"
    async with running_sim(sim()) as url:
        assert (await load(url, "llama3.1:8b", 4096))[0] == 200
        config.write_text(
            f'[server]\nadmin_key = "{secrets[1]}"\n'
            f'[[backends]]\nname = "sim"\nurl = "{url}"\napi_key = "{secrets[0]}"\n'
            f'vram = "{url}/sim/metrics"\n'
            f'[tenants.team]\napi_keys = ["{secrets[2]}"]\n')
        await check(capsys, "--config", str(config), "--report", str(report),
                    "--error", f"Authorization: Bearer {secrets[0]} CUDA error: out of memory")
    with tarfile.open(report) as archive:
        names = archive.getnames()
        contents = "".join(archive.extractfile(m).read().decode() for m in archive.getmembers())  # type: ignore[union-attr]
    assert {"kvgate-check/findings.json", "kvgate-check/config.json", "kvgate-check/backend-answers.json"} <= set(names)
    assert "/api/ps" in contents and "llama3.1:8b" in contents
    for secret in secrets:
        assert secret not in contents


async def test_unified_pool_overrun_from_the_simulator_is_its_signature(capsys: pytest.CaptureFixture[str]) -> None:
    """Four long chats at once on the simulated llama-server's unified pool: every one fails with the message
    ``kvgate check --error`` must name, with the fix."""
    words = " ".join(f"w{i}" for i in range(1500))
    body = {"model": "m", "max_tokens": 1500, "messages": [{"role": "user", "content": words}]}
    async with running_sim(sim(mode="llama-server", ctx_size=8192)) as url, aiohttp.ClientSession(url) as session:
        answers = await asyncio.gather(*(post(session, "/v1/chat/completions", body) for _ in range(4)))
        errors = [json.dumps(answer) for status, answer in answers if status == 500]
        assert errors, answers
        _, found = await check(capsys, "--backend", f"llama-server={url}", "--error", errors[0])
    assert "signature:unified_pool_exceeded" in found, errors[0]


async def test_the_longest_prompt_comes_from_a_running_kvgate(capsys: pytest.CaptureFixture[str]) -> None:
    """``--gateway``: the prompts kvgate counted stand in for --prompt-tokens; a 6,000-token prompt against a model
    loaded at 4,096 tokens is a finding."""
    async with running_sim(sim()) as url, running_gateway([{"name": "sim", "kind": "ollama", "url": url}],
                               server={"admin_key": "admin-key-for-the-check"}) as gateway:
        chat = {"model": "llama3.1:8b", "stream": False, "options": {"num_ctx": 8192},
                "messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(6000))}]}
        async with aiohttp.ClientSession() as http, http.post(f"{gateway}/api/chat", json=chat) as response:
            assert response.status == 200, await response.text()
        assert (await load(url, "llama3.1:8b", 4096))[0] == 200  # reloaded smaller behind kvgate's back
        _, found = await check(capsys, "--backend", f"ollama={url}", "--gateway", gateway,
                               "--admin-key", "admin-key-for-the-check")
    assert "longest_prompt_unknown" not in found
    assert "prompt_exceeds_context" in found, sorted(found)
    assert "counted by kvgate" in json.dumps(found["prompt_exceeds_context"])
