"""Issue 15, point 2: the status page at ``/kvgate/``, served as three static files, read in headless Chromium.

The browser test puts kvgate with an admin key in front of the simulated llama-server (one unified KV pool of 16,384
tokens on a 16 GiB GPU, beside a 3 GiB foreign process) under load: two answers held open (alice, bob), two
requests queued behind them (alice, carol), one refused because the queue is full and one for a tenant's prompt cap.
The page asks for the key, is given it through its prompt, and must then show the simulator's GPU as bar segments of
the right widths, the pool's sequences as the ledger holds them, the queue per tenant and the refusals with their
reasons. A screenshot is kept in ``$KVGATE_TEST_ARTIFACTS`` (default ``tests/artifacts/``);
``KVGATE_UPDATE_SCREENSHOT=1`` also copies it to ``docs/status-page.png`` for the README.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from kvsim.catalog import CATALOG
from kvsim.config import SimConfig
from kvsim.gpu.exporter import EXPORTER_PATH
from kvsim.gpu.kv_cache import AttentionLayers, kv_bytes, llama_server_cells
from kvsim.runner import start_sim
from tests.support.chromium import Page, find_chromium, headless_chromium
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "page-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TENANTS = {"alice": {"api_keys": ["alice-key"]}, "bob": {"api_keys": ["bob-key"]},
           "carol": {"api_keys": ["carol-key"], "max_prompt_tokens": 64}}
PAGE_FILES = ("/kvgate/", "/kvgate/status.js", "/kvgate/status.css")


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers or {}, allow_redirects=False) as reply:
        return reply.status, dict(reply.headers), await reply.read()


async def test_the_page_is_static_public_and_locked_down() -> None:
    async with running(FakeLLM()) as fake, running_gateway([{"name": "one", "url": fake.url}],
                                                           server={"admin_key": ADMIN_KEY}) as url:
        for path in PAGE_FILES:
            status, headers, body = await _get(url + path)
            assert status == 200, path
            assert headers["X-Content-Type-Options"] == "nosniff" and headers["Cache-Control"] == "no-store"
            csp = headers["Content-Security-Policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
            assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
            assert not re.search(rb"https?://", body), f"{path} names an external URL"
            assert b"innerHTML" not in body and b"insertAdjacentHTML" not in body and b"document.write" not in body
        assert (await _get(url + "/kvgate/"))[1]["Content-Type"] == "text/html; charset=utf-8"
        assert (await _get(url + "/kvgate/status.js"))[1]["Content-Type"] == "text/javascript; charset=utf-8"
        status, headers, _ = await _get(url + "/kvgate")
        assert status == 302 and headers["Location"] == "kvgate/"
        assert (await _get(url + "/kvgate/status"))[0] == 403
        assert (await _get(url + "/kvgate/status", {"Authorization": "Bearer wrong"}))[0] == 403
        status, _, body = await _get(url + "/kvgate/status", ADMIN)
        assert status == 200 and orjson.loads(body)["recent"] == []
        assert fake.requests_to("/kvgate/") == fake.requests_to("/kvgate") == []  # kvgate answers them itself


def _chromium() -> str:
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI", "").lower() == "true":  # as tests/conftest_llama.py: CI installs it, so must have it
            pytest.fail("chromium is not installed; CI=true requires it (scripts/test installs it as root)")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; scripts/test does it as root)")
    return binary


def _artifacts() -> Path:
    return Path(os.environ.get("KVGATE_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts")


def _chat(max_tokens: int, *, words: int = 3, hold: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "llama3.1:8b", "max_tokens": max_tokens, "stream": hold,
                            "messages": [{"role": "user", "content": " ".join(["hello"] * words)}]}
    if hold:
        body["ignore_eos"] = True  # the simulator generates until max_tokens: minutes at 20 tokens/s
    return body


@asynccontextmanager
async def _under_load(sim: str, url: str) -> AsyncIterator[list[tuple[int, str]]]:
    """Two answers held open, two requests queued, two refused; yields the refusals (status, message)."""
    async with aiohttp.ClientSession() as http:
        async def post(tenant: str, body: dict[str, Any]) -> tuple[int, str]:
            async with http.post(f"{url}/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {tenant}-key"}) as reply:
                return reply.status, (await reply.read()).decode()

        async def busy_slots() -> int:
            async with http.get(f"{sim}/slots") as reply:
                return sum(slot["is_processing"] for slot in await reply.json())

        async def queued() -> int:
            async with http.get(f"{url}/kvgate/status", headers=ADMIN) as reply:
                return sum(pool["queued"] for pool in (await reply.json())["pools"])

        status, text = await post("alice", _chat(100_000))  # clamped to the pool
        assert status == 200, text
        held = [asyncio.ensure_future(post(t, _chat(6000, hold=True))) for t in ("alice", "bob")]
        waiting: list[asyncio.Future[tuple[int, str]]] = []
        try:
            await until(_at_least(busy_slots, 2))
            for tenant in ("alice", "carol"):
                waiting.append(asyncio.ensure_future(post(tenant, _chat(6000))))
                await until(_at_least(queued, len(waiting)))
            refusals = [await post("bob", _chat(6000)), await post("carol", _chat(200, words=200))]
            yield refusals
        finally:
            for task in held + waiting:
                task.cancel()
            await asyncio.gather(*held, *waiting, return_exceptions=True)
        await until(_at_most(busy_slots, 0))  # the simulator's handlers end before it stops


def _at_least(read: Callable[[], Awaitable[int]], n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await read() >= n
    return check


def _at_most(read: Callable[[], Awaitable[int]], n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await read() <= n
    return check


READ_PAGE = """(() => {
  const texts = (row) => [...row.cells].map((cell) => cell.textContent);
  const bar = document.querySelector(".gpu .bar");
  const pool = document.querySelector(".pool");
  return {
    keyKept: sessionStorage.getItem("kvgate-admin-key"),
    keyFormHidden: document.getElementById("key-form").hidden,
    banner: document.getElementById("banner").hidden ? null : document.getElementById("banner").textContent,
    barWidth: bar.clientWidth,
    segments: [...bar.children].map((s) => ({kind: s.dataset.kind, bytes: Number(s.dataset.bytes),
                                            width: s.getBoundingClientRect().width})),
    legend: [...document.querySelectorAll(".gpu .legend li")].map((li) => li.textContent),
    layout: pool.querySelector("[data-field=layout]").textContent,
    counts: Object.fromEntries([...pool.querySelectorAll("[data-field=counts] [data-count]")]
      .map((b) => [b.dataset.count, b.textContent])),
    refusedBy: Object.fromEntries([...pool.querySelectorAll("[data-field=counts] [data-refused]")]
      .map((b) => [b.dataset.refused, b.textContent])),
    totals: Object.fromEntries([...document.querySelectorAll("#outcomes [data-count]")]
      .map((b) => [b.dataset.count, b.textContent])),
    active: pool.querySelector("[data-field=active]").textContent,
    reserved: pool.querySelector("[data-field=reserved]").textContent,
    sequences: [...pool.querySelectorAll("table.sequences tbody tr")].map(texts),
    queue: [...document.querySelectorAll("#queue tbody tr")].map(texts),
    decisions: [...document.querySelectorAll("#decisions tbody tr")].map(texts),
  };
})()"""


async def _enter_key(page: Page, url: str) -> None:
    """Open the page, wait for its key prompt, type the admin key and submit it, as a person would."""
    await page.navigate(f"{url}/kvgate/")
    await until(lambda: page.evaluate("document.getElementById('key-form')?.hidden === false"), timeout_s=10.0)
    await page.evaluate("document.getElementById('key').focus()")
    await page.call("Input.insertText", text=ADMIN_KEY)
    await page.evaluate("document.getElementById('key-submit').click()")
    await until(lambda: page.evaluate("Number(document.body.dataset.updates || 0) >= 1"), timeout_s=10.0)


async def test_the_page_shows_the_simulator_under_load_in_chromium() -> None:
    binary = _chromium()
    started_s = time.monotonic()
    config = SimConfig(mode="llama-server", server_model="llama3.1:8b", ctx_size=16384, gpu_bytes=(16 * GIB,),
                       gen_tokens_per_s=20.0, min_response_tokens=4, max_response_tokens=8)
    runner, sim = await start_sim(config)
    backend = {"name": "cpp", "kind": "llama-server", "url": sim, "vram": sim + EXPORTER_PATH, "vram_refresh_s": 0.05}
    try:
        async with aiohttp.ClientSession() as http, http.post(f"{sim}/sim/processes",
                                                              json={"name": "trainer", "bytes": 3 * GIB}) as reply:
            assert reply.status in (200, 201)
        async with running_gateway([backend], tenants=TENANTS, server={"admin_key": ADMIN_KEY},
                                   admission={"max_queue": 2}) as url, _under_load(sim, url) as refusals:
            print(f"\nrefusals: {refusals}")
            assert [status for status, _ in refusals] == [503, 400]
            simulated = orjson.loads((await _get(f"{sim}/sim/gpu"))[2])
            slots = orjson.loads((await _get(f"{sim}/slots"))[2])
            status = await until(lambda: _settled(url, simulated))
            async with headless_chromium(binary, width=1280, height=1000) as page:
                await _enter_key(page, url)
                shown = await page.evaluate(READ_PAGE)
                shot = await page.screenshot(_artifacts() / "status-page.png")
            print(f"screenshot: {shot} ({shot.stat().st_size:,} bytes); {time.monotonic() - started_s:.1f} s")
            if os.environ.get("KVGATE_UPDATE_SCREENSHOT"):
                shutil.copyfile(shot, ROOT / "docs" / "status-page.png")
            assert shown["keyKept"] == ADMIN_KEY and shown["keyFormHidden"] and shown["banner"] is None
            _check_gpu(shown, simulated, _simulated_kv_bytes(config))
            _check_pool(shown, status, slots)
            _check_queue_and_decisions(shown, status, refusals)
            _check_layout_and_counts(shown, status)
    finally:
        await runner.cleanup()


async def _settled(url: str, simulated: dict[str, Any]) -> dict[str, Any] | None:
    """kvgate's status once its GPU reading is the simulator's (the trainer included)."""
    _, _, body = await _get(f"{url}/kvgate/status", ADMIN)
    status: dict[str, Any] = orjson.loads(body)
    gpu = status["gpus"][0]
    return status if gpu.get("used_bytes") == simulated["devices"][0]["used_bytes"] else None



def _simulated_kv_bytes(config: SimConfig) -> int:
    """The KV pool the simulator itself allocated for its llama-server flags (its memory model, not kvgate's)."""
    layers = AttentionLayers.of(CATALOG[config.server_model])
    cells = llama_server_cells(layers, ctx_size=config.ctx_size, n_parallel=4, unified=True)
    return kv_bytes(layers, cells)


def _check_gpu(shown: dict[str, Any], simulated: dict[str, Any], kv_pool_bytes: int) -> None:
    """Bar segments as wide as their share of the GPU, summing to the simulator's GPU; free memory as the simulator
    has it; the model (kvgate's estimate) and the foreign process close to the simulator's own figures."""
    [device] = simulated["devices"]
    total, bar = device["total_bytes"], shown["barWidth"]
    segments = {s["kind"]: s for s in shown["segments"]}
    assert list(segments) == ["weights", "kv", "compute", "other", "free"], shown["segments"]
    assert sum(s["bytes"] for s in shown["segments"]) == total
    for segment in shown["segments"]:
        assert abs(segment["width"] - bar * segment["bytes"] / total) <= 1.5, segment
    assert segments["free"]["bytes"] == device["free_bytes"]
    server = next(p["used_bytes"] for p in simulated["processes"] if not p["foreign"])
    trainer = next(p["used_bytes"] for p in simulated["processes"] if p["foreign"])
    model = sum(segments[kind]["bytes"] for kind in ("weights", "kv", "compute"))
    assert abs(model - server) <= 0.1 * server and abs(segments["other"]["bytes"] - trainer) <= 0.1 * server
    assert abs(segments["kv"]["bytes"] - kv_pool_bytes) <= 0.01 * kv_pool_bytes
    assert abs(segments["free"]["width"] / bar - device["free_bytes"] / total) < 0.002
    assert shown["legend"][1] == f"KV pool llama3.1:8b {segments['kv']['bytes'] / GIB:.2f} GiB"


def _check_pool(shown: dict[str, Any], status: dict[str, Any], slots: list[dict[str, Any]]) -> None:
    """The pool's sequences as the ledger holds them, and as many as the simulator is running."""
    [pool] = status["pools"]
    ledger = [[f"#{s['id']}", s["tenant"], f"{s['tokens']:,}", str(s["sequences"]),
               f"{100 * s['tokens'] / pool['capacity_tokens']:.1f} %"] for s in pool["sequences"]]
    assert shown["sequences"] == ledger and [row[1] for row in ledger] == ["alice", "bob"]
    assert shown["active"] == str(pool["active_sequences"]) == "2"
    assert shown["reserved"] == f"{pool['reserved_tokens']:,}"
    busy = [slot for slot in slots if slot["is_processing"]]
    assert len(busy) == 2  # each reservation is the simulator's prompt plus the output it may still generate
    assert sorted(s["tokens"] for s in pool["sequences"]) == sorted(
        slot["n_prompt_tokens_processed"] + slot["params"]["n_predict"] for slot in busy)


def _check_layout_and_counts(shown: dict[str, Any], status: dict[str, Any]) -> None:
    """The pool named as what it is (one unified pool of 16,384 cells, not 4 x 16,384 tokens), and its requests by
    outcome as the status counts them: the clamped chat admitted, the two refusals by reason; the held and queued
    requests are counted when they end."""
    [pool] = status["pools"]
    print(f"layout: {shown['layout']!r}; counts: {shown['counts']}; refused: {shown['refusedBy']}; "
          f"totals: {shown['totals']}")
    assert pool["layout"] == "16,384 cells shared by 4 slots" and shown["layout"] == f"· unified · {pool['layout']}"
    assert (pool["admitted_total"], pool["clamped_total"], pool["refused_total"]) == (1, 1, 2)
    assert pool["refused"] == {"max_prompt_tokens": 1, "queue_full": 1}
    assert shown["counts"] == {"admitted": "1", "clamped": "1", "refused": "2"}  # zero counts are left out
    assert shown["refusedBy"] == {"max_prompt_tokens": "1", "queue_full": "1"}
    assert shown["totals"] == {name.removesuffix("_total"): f"{value:,}" for name, value in status["outcomes"].items()
                               if name.endswith("_total") and name != "rewritten_total"}  # shown as its two kinds
    assert shown["totals"]["refused"] == "2" and shown["totals"]["trimmed"] == "0"


def _check_queue_and_decisions(shown: dict[str, Any], status: dict[str, Any], refusals: list[tuple[int, str]]
                               ) -> None:
    """The queue per tenant in the ledger's order; both refusals with kvgate's reasons; the clamped request."""
    waiting = status["pools"][0]["waiting"]
    assert [(row[0], row[2], row[4]) for row in shown["queue"]] == [
        (w["tenant"], "1", str(w["position"])) for w in waiting]
    assert sorted(row[0] for row in shown["queue"]) == ["alice", "carol"]
    assert all("this request needs" in row[6] for row in shown["queue"])
    decisions = [(row[1], row[2], row[4], row[6]) for row in shown["decisions"]]
    messages = [orjson.loads(text)["error"]["message"] for _, text in refusals]
    assert decisions[0] == ("refused", "carol", "400", f"max_prompt_tokens: {messages[1]}")
    assert decisions[1] == ("refused", "bob", "503", f"queue_full: {messages[0]}")
    assert decisions[2][:3] == ("clamped", "alice", "200") and "max_tokens=" in decisions[2][3]
    assert len(decisions) == 3  # the held and queued requests are decided when they end
