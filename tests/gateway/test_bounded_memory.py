"""Issue 10, point 1: kvgate's memory is bounded whatever clients send, and request Content-Encoding is handled.

The process test runs ``kvgate serve`` as a user would, in front of a fake Ollama, with the model's real tokenizer
(a GGUF vocabulary named in the settings, so small prompts count exactly), reads its RSS from /proc and sends the
attacks of the issue: 8 concurrent 20 MiB chats, 20 concurrent 30 MiB bodies, 5,000 distinct model names (here 4 chats,
12 bodies, each overflowing one waiting 0.2 s for room rather than 2, and 1,000 names: still three times what the
body budget holds and 60 times the bound on unlisted counter chains, in a fraction of the time).

Measured on the development box (before: the same attacks on the code before the bounds):

    baseline ~285 MB; 8 x 20 MiB chats: before 4.2 GB peak, 4.2 GB after; now ~650 MB peak
    20 x 30 MiB bodies: before ~5.3 GB peak; now ~1.1 GB peak (the body budget answers the overflow with 503)
    5,000 model names: before one counter chain each; now at most 16 unlisted chains; after all: ~310-340 MB

The stated bound: the peak stays under baseline + RSS_PEAK_BOUND_MB, and RSS returns to baseline +
RSS_AFTER_BOUND_MB once the attacks are over.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import random
import re
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.body.budget import BodyBudget, fits
from gateway.body.encoding import BodyDecoder, coding_of
from gateway.errors import BadRequest, PayloadTooLarge, ServerBusy, UnsupportedMediaType
from gateway.headers import upstream_request_headers
from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway
from tests.tokens.vocab_vectors import vocab_path, warmed_cache_dir

VOCAB = vocab_path("llama-bpe")
MODEL = "llama3.1:8b"
RSS_PEAK_BOUND_MB = 1300
RSS_AFTER_BOUND_MB = 250
CHATS = 4  # concurrent 20 MiB chats: before the bounds, 4 alone went over 2 GB
BODIES = 12  # concurrent 30 MiB bodies: over three times what the default 128 MiB body budget holds at once
NAMES = 1000  # distinct model names: over 60 times the bound on unlisted counter chains
HELD_BODY_WAIT_S = 0.2  # how long an overflowing body waits for room before its 503 (default 2 s)
MiB = 1024 * 1024


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _text(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    line = " ".join(rng.choice(words) for _ in range(400)) + ".\n"
    return (line * (n_bytes // len(line) + 1))[:n_bytes]


def _is_ollama_error(body: bytes) -> bool:
    data = json.loads(body)
    return isinstance(data, dict) and isinstance(data.get("error"), str) and bool(data["error"])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
async def test_rss_stays_bounded_under_memory_attacks(tmp_path: Path) -> None:
    T0=time.monotonic()
    async with running(FakeLLM()) as fake:
        config = tmp_path / "kvgate.toml"
        config.write_text(
            f'[server]\nheld_body_wait_s = {HELD_BODY_WAIT_S}\n'
            f'[counting]\ncache_dir = "{warmed_cache_dir("llama-bpe")}"\n'  # memory, not conversion, is tested
            f'[models."{MODEL}"]\ngguf_path = "{VOCAB}"\n'
            f'[[backends]]\nname = "fake"\nkind = "ollama"\nurl = "{fake.url}"\n'
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0",
            stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
        )
        assert process.stderr is not None
        stderr = process.stderr
        log: list[str] = []
        try:
            url = ""
            while not url:
                line = (await asyncio.wait_for(stderr.readline(), timeout=20)).decode()
                assert line, "kvgate exited: " + "".join(log)
                log.append(line)
                if match := re.search(r"listening on (http://127\.0\.0\.1:\d+)", line):
                    url = match.group(1)

            async def drain() -> None:
                while line := await stderr.readline():
                    log.append(line.decode(errors="replace"))

            drainer = asyncio.create_task(drain())
            print('listening', time.monotonic()-T0)
            peak_mb = 0.0
            polling = True

            async def poll() -> None:
                nonlocal peak_mb
                while polling:
                    peak_mb = max(peak_mb, _rss_mb(process.pid))
                    await asyncio.sleep(0.02)

            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                small = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "Hello there"}]}
                counter = ""
                for _ in range(100):  # the tokenizer is loaded (from the warmed cache) meanwhile
                    async with http.post(f"{url}/api/chat", json=small) as response:
                        assert response.status == 200
                        counter = response.headers["X-Kvgate-Counter"]
                    if counter == "gguf; exact":
                        break
                    await asyncio.sleep(0.1)
                assert counter == "gguf; exact"
                print('tokenizer', time.monotonic()-T0)
                await asyncio.sleep(0.5)
                baseline_mb = _rss_mb(process.pid)
                poller = asyncio.create_task(poll())
                started_s = time.monotonic()

                async def post(path: str, body: bytes) -> tuple[int, bytes, str | None]:
                    async with http.post(f"{url}{path}", data=io.BytesIO(body),
                                         headers={"Content-Type": "application/json"}) as response:
                        return response.status, await response.read(), response.headers.get("Retry-After")

                # 8 concurrent 20 MiB chats to a model with an exact tokenizer: estimated (over
                # counting.exact_count_max_bytes), and refused as longer than the context, in Ollama's format
                big = _text(20 * MiB, 1)
                chats = [json.dumps({"model": MODEL, "stream": False,
                                     "messages": [{"role": "user", "content": f"{i} {big}"}]}).encode()
                         for i in range(CHATS)]
                del big
                results = await asyncio.gather(*(post("/api/chat", body) for body in chats))
                del chats
                for status, body, _ in results:
                    assert status in (400, 503), (status, body[:200])
                    assert _is_ollama_error(body)
                    if status == 400:
                        assert b"estimated" in body and b"context" in body
                chats_peak_mb = peak_mb
                print('chats', time.monotonic()-T0, peak_mb, baseline_mb)

                # BODIES concurrent 30 MiB bodies: the body budget holds some, the others get 503 with Retry-After
                blob = (b'{"model": "' + MODEL.encode() + b'", "stream": false, "messages": [{"role": "user", '
                        b'"content": "' + b"x" * (30 * MiB - 200) + b'"}]}')
                results = await asyncio.gather(*(post("/api/chat", blob) for _ in range(BODIES)))
                del blob
                statuses = sorted(status for status, _, _ in results)
                print('bodies', time.monotonic()-T0, peak_mb, statuses)
                for status, body, retry_after in results:
                    assert status in (400, 503), (status, body[:200])
                    assert _is_ollama_error(body)
                    if status == 503:
                        assert retry_after is not None and int(retry_after) >= 1
                        assert b"max_held_body_bytes" in body

                # NAMES distinct model names, on a chat route (404) and /kvgate/count (counted, never kept each)
                seen: dict[int, int] = {}
                gate = asyncio.Semaphore(64)

                async def named(i: int) -> None:
                    name = f"made-up-{i}-" + "m" * 100
                    body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
                    path = ("/v1/chat/completions", "/kvgate/count?route=/v1/chat/completions")[i % 2]
                    async with gate, http.post(f"{url}{path}", json=body) as response:
                        data = await response.json()
                        seen[response.status] = seen.get(response.status, 0) + 1
                        if response.status != 200:
                            assert isinstance(data["error"]["message"], str)  # OpenAI's format

                await asyncio.gather(*(named(i) for i in range(NAMES)))
                assert set(seen) <= {200, 404}, seen
                print('names', time.monotonic()-T0, peak_mb)
                async with http.get(f"{url}/kvgate/metrics") as response:
                    assert response.status == 200
                    assert "made-up-" not in await response.text()
                async with http.post(f"{url}/api/chat", json=small) as response:
                    assert response.status == 200
                    assert response.headers["X-Kvgate-Counter"] == "gguf; exact"

                print('small', time.monotonic()-T0)
                polling = False
                await poller
                after_mb = _rss_mb(process.pid)
                for _ in range(50):  # freed memory goes back to the system as the allocator trims
                    if after_mb < baseline_mb + RSS_AFTER_BOUND_MB:
                        break
                    await asyncio.sleep(0.1)
                    after_mb = _rss_mb(process.pid)
                print(f"\nkvgate RSS: baseline {baseline_mb:.0f} MB, peak {peak_mb:.0f} MB ({CHATS} x 20 MiB chats: "
                      f"{chats_peak_mb:.0f} MB), after {after_mb:.0f} MB; 30 MiB bodies answered {statuses}; "
                      f"names {seen}; {time.monotonic() - started_s:.1f} s")
                assert peak_mb < baseline_mb + RSS_PEAK_BOUND_MB
                assert after_mb < baseline_mb + RSS_AFTER_BOUND_MB
            drainer.cancel()
            print('after', time.monotonic()-T0, after_mb)
            assert "Traceback" not in "".join(log)
        finally:
            if process.returncode is None:
                process.terminate()
                await process.wait()


# --- the body budget -------------------------------------------------------------------------------------------


def test_fits_is_a_sum_against_the_capacity() -> None:
    assert fits(0, 10, 10)
    assert fits(4, 10, 6)
    assert not fits(5, 10, 6)


async def test_budget_waits_for_released_bytes_then_refuses_with_retry_after() -> None:
    budget = BodyBudget(100, wait_s=0.2)
    first = budget.lease()
    await first.take(80)
    second = budget.lease()
    waiting = asyncio.ensure_future(second.take(50))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    first.release()
    await asyncio.wait_for(waiting, 1)
    assert budget.held_bytes == 50
    third = budget.lease()
    with pytest.raises(ServerBusy) as busy:
        await third.take(60)
    assert busy.value.status == 503 and busy.value.retry_after_s is not None and busy.value.retry_after_s >= 1
    with pytest.raises(PayloadTooLarge):
        await budget.lease().take(101)
    second.release()
    second.release()  # idempotent
    assert budget.held_bytes == 0


# --- Content-Encoding ----------------------------------------------------------------------------------------------


def _decode(coding: str, data: bytes, max_bytes: int = MiB, step: int = 1000) -> bytes:
    decoder = BodyDecoder(coding, max_bytes=max_bytes)
    out: list[bytes] = []
    for start in range(0, len(data), step):
        out += decoder.feed(data[start:start + step])
    return b"".join(out + decoder.finish())


def test_decoder_reads_gzip_members_and_both_deflate_forms() -> None:
    assert _decode("gzip", gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"
    assert _decode("deflate", zlib.compress(b"wrapped")) == b"wrapped"
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert _decode("deflate", raw.compress(b"raw") + raw.flush()) == b"raw"


def test_decoder_refuses_broken_truncated_and_oversized_data() -> None:
    with pytest.raises(BadRequest, match="not valid gzip"):
        _decode("gzip", b"this is not gzip")
    with pytest.raises(BadRequest, match="truncated"):
        _decode("gzip", gzip.compress(b"hello" * 100)[:-6])
    bomb = gzip.compress(bytes(64 * MiB))  # 64 KiB that expand a thousandfold
    with pytest.raises(PayloadTooLarge, match="decodes"):
        _decode("gzip", bomb, max_bytes=MiB, step=64 * 1024)


def test_codings() -> None:
    assert coding_of(None) is None and coding_of("identity") is None
    assert coding_of("GZIP") == "gzip" and coding_of("x-gzip") == "gzip" and coding_of("deflate") == "deflate"
    for unknown in ("br", "zstd", "gzip, gzip", "compress", "\udcff"):
        with pytest.raises(UnsupportedMediaType):
            coding_of(unknown)


def test_decoded_body_goes_on_without_its_content_encoding() -> None:
    from multidict import CIMultiDict, CIMultiDictProxy

    incoming = CIMultiDictProxy(CIMultiDict({"Content-Encoding": "gzip", "Content-Type": "application/json"}))
    kept = upstream_request_headers(incoming, host="h", request_id="r", api_key=None, client_ip=None)
    dropped = upstream_request_headers(incoming, host="h", request_id="r", api_key=None, client_ip=None,
                                       body_decoded=True)
    assert kept["Content-Encoding"] == "gzip"
    assert "Content-Encoding" not in dropped and dropped["Content-Type"] == "application/json"


async def test_request_content_encoding_end_to_end() -> None:
    chat = json.dumps({"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}]}).encode()
    async with running(FakeLLM()) as fake, \
            running_gateway([{"name": "f", "kind": "ollama", "url": fake.url}],
                            server={"max_body_bytes": 1 * MiB}) as url, \
            aiohttp.ClientSession() as http:

        async def post(path: str, body: bytes, encoding: str) -> tuple[int, Any]:
            headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
            async with http.post(f"{url}{path}", data=io.BytesIO(body), headers=headers) as response:
                return response.status, await response.json(content_type=None)

        status, _ = await post("/api/chat", gzip.compress(chat), "gzip")
        assert status == 200
        forwarded = [s for s in fake.seen if s.path_qs == "/api/chat"][-1]
        assert json.loads(forwarded.body)["messages"][0]["content"] == "hi"
        assert "Content-Encoding" not in forwarded.headers
        status, body = await post("/api/chat", b"not gzip at all", "gzip")
        assert status == 400 and "not valid gzip" in body["error"]
        status, body = await post("/v1/chat/completions", chat, "br")
        assert status == 415 and "br" in body["error"]["message"]  # OpenAI's format
        status, body = await post("/api/chat", gzip.compress(b" " * (64 * MiB)), "gzip")
        assert status == 413 and "max_body_bytes" in body["error"]
        blob = gzip.compress(b"layer bytes")  # streamed through: bytes and header as sent
        status, _ = await post("/api/blobs/sha256:abc", blob, "gzip")
        assert status == 201
        upload = [s for s in fake.seen if s.path_qs.startswith("/api/blobs/")][-1]
        assert upload.body == blob and upload.headers["Content-Encoding"] == "gzip"


# --- the body budget and the count bound, end to end --------------------------------------------------------------


async def test_held_bodies_are_bounded_across_requests() -> None:
    fake = FakeLLM()
    fake.script.hold_after_chunks = 1
    chat = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x" * 12_000}]}
    async with running(fake), \
            running_gateway([{"name": "f", "kind": "ollama", "url": fake.url}],
                            server={"max_held_body_bytes": 20_000, "held_body_wait_s": 0.2}) as url, \
            aiohttp.ClientSession() as http:
        held = await http.post(f"{url}/api/chat", json=chat)  # its body stays held while its stream runs
        assert held.status == 200
        async with http.post(f"{url}/v1/chat/completions", json=chat) as response:
            assert response.status == 503
            assert int(response.headers["Retry-After"]) >= 1
            assert "max_held_body_bytes" in (await response.json())["error"]["message"]
        too_big = {**chat, "messages": [{"role": "user", "content": "x" * 25_000}]}
        async with http.post(f"{url}/api/chat", json=too_big) as response:
            assert response.status == 413
        fake.script.release.set()
        await held.read()
        held.release()
        fake.script.hold_after_chunks = None
        async with http.post(f"{url}/api/chat", json={**chat, "stream": False}) as response:
            assert response.status == 200


async def test_a_prompt_over_the_exact_count_bound_is_estimated_and_admitted() -> None:
    async with running(FakeLLM()) as fake, \
            running_gateway([{"name": "f", "kind": "ollama", "url": fake.url}],
                            models={MODEL: {"gguf_path": str(VOCAB)}},
                            counting={"cache_dir": str(warmed_cache_dir("llama-bpe")),
                                      "exact_count_max_bytes": 4096}) as url, \
            aiohttp.ClientSession() as http:
        small = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "Hello there"}]}
        counter = ""
        for _ in range(100):
            async with http.post(f"{url}/api/chat", json=small) as response:
                counter = response.headers["X-Kvgate-Counter"]
            if counter == "gguf; exact":
                break
            await asyncio.sleep(0.1)
        assert counter == "gguf; exact"
        large = {**small, "messages": [{"role": "user", "content": "word " * 2000}]}  # 10,000 bytes
        async with http.post(f"{url}/api/chat", json=large) as response:
            assert response.status == 200
            assert response.headers["X-Kvgate-Counter"] == "estimate; estimate"
            prompt = int(response.headers["X-Kvgate-Prompt-Tokens"])
            assert prompt >= 10_000 / 3  # bytes / estimate_bytes_per_token, plus the margin
            assert int(response.headers["X-Kvgate-Reserved-Tokens"]) > prompt


async def test_counter_chains_for_unlisted_names_are_bounded() -> None:
    from gateway.app import PROMPT_COUNTER, create_app, start_server
    from gateway.config import load_settings
    from gateway.tokens.prompt_counter import UNLISTED_CHAINS

    async with running(FakeLLM()) as fake:
        settings = load_settings(None, backends=[{"name": "o", "kind": "openai", "url": fake.url}])
        app = create_app(settings, refresh_models=False)
        runner, port = await start_server(app, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as http:
                for i in range(3 * UNLISTED_CHAINS):
                    body = {"model": f"guess-{i}", "messages": [{"role": "user", "content": "hi"}]}
                    async with http.post(f"http://127.0.0.1:{port}/kvgate/count?route=/v1/chat/completions",
                                         json=body) as response:
                        assert response.status == 200
                        assert (await response.json())["counter"] == "estimate"
            assert app[PROMPT_COUNTER].chains_held() <= UNLISTED_CHAINS
        finally:
            await runner.cleanup()


def test_tokenizer_batches_are_bounded_in_characters() -> None:
    from gateway.tokens.engine import _batches

    pieces = ["a" * 300, "b" * 300, "c" * 300, "d" * 2000, "e"]
    assert _batches(pieces, 700) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert _batches([], 700) == []


def test_prompt_bytes_measures_what_a_tokenizer_would_read() -> None:
    from gateway.domain import Prompt
    from gateway.tokens.request_count import prompt_bytes

    chat = Prompt(messages=({"role": "user", "content": "héllo"}, {"role": "assistant", "content": [
        {"type": "text", "text": "abc"}], "thinking": "xy"}))
    assert prompt_bytes(chat) == 6 + 3 + 2
    assert prompt_bytes(Prompt(text=["abcd", [1, 2, 3], {"prompt_string": "ef"}])) == 6
