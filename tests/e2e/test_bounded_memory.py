"""Issue 10, point 1: kvgate's memory is bounded whatever clients send, and request Content-Encoding is handled.

The process tests run ``kvgate serve`` as a user would (one process for the module), in front of a fake Ollama, with
a model's real tokenizer (a GGUF vocabulary named in the settings, so small prompts count exactly), read its RSS from
/proc and send the attacks of the issue, one test each: 8 concurrent 20 MiB chats, 20 concurrent 30 MiB bodies,
5,000 distinct model names. They run at a quarter of the scale, against limits set to a quarter of the defaults, so
the ratios stay: 4 chats of 5 MiB, five times ``counting.exact_count_max_bytes`` (1 MiB here, 4 MiB by default);
12 bodies of 7.5 MiB, three times what ``server.max_held_body_bytes`` holds (32 MiB here, 128 MiB by default), each
overflowing one waiting 0.2 s for room rather than 2; 400 names, 25 times the bound on unlisted counter chains. The
vocabulary is llama.cpp's LLaMA SPM one (32K tokens, served as llama2:7b): it loads in ~0.1 s, Llama 3's in ~1 s.

Measured on the development box at full scale (before: the same attacks on the code before the bounds):

    baseline ~285 MB; 8 x 20 MiB chats: before 4.2 GB peak, 4.2 GB after; now ~650 MB peak
    20 x 30 MiB bodies: before ~5.3 GB peak; now ~1.1 GB peak (the body budget answers the overflow with 503)
    5,000 model names: before one counter chain each; now at most 16 unlisted chains; after all: ~310-340 MB

and here, at a quarter of the scale (2 cores): baseline ~110 MB; 4 x 5 MiB chats: peak +45-50 MB; 12 x 7.5 MiB
bodies: peak +70-90 MB (4 answered 400, 8 refused 503); 400 names: no growth; after each attack: +2-10 MB. Since an
estimate no longer refuses (issue 22: the chats and bodies over exact_count_max_bytes are cut head-and-tail to the
context, Ollama would cut them silently), measured the same way: chats peak +49 MB, after +10; bodies (4 answered
200, 8 refused 503) peak +70 MB, after +21.

The stated bound, scaled with the attacks: each attack's peak stays under baseline + RSS_PEAK_BOUND_MB, and RSS returns
to baseline + RSS_AFTER_BOUND_MB once it is over and kvgate serves ordinary requests again (bursts of small chats: what
an attack freed can stay in RSS however long kvgate idles, until later requests let the allocator and the collector
give it back).
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
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gateway.edge.body.budget import BodyBudget, fits
from gateway.edge.body.encoding import BodyDecoder, coding_of
from gateway.edge.headers import Hop, upstream_request_headers
from gateway.errors import BadRequest, PayloadTooLarge, ServerBusy, UnsupportedMediaType
from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until
from tests.tokens.vocab_vectors import SESSION_CACHE_DIR, vocab_path, warmed_cache_dir

MODEL = "llama3.1:8b"
EXACT_MODEL = "llama2:7b"
"""A model counted with its real tokenizer: llama.cpp's LLaMA SPM vocabulary, quick to load."""
EXACT_VOCAB = "llama-spm"
MiB = 1024 * 1024
SCALE = 4  # the attacks and the limits they go against are a quarter of the and of the defaults
EXACT_COUNT_MAX_BYTES = 4 * MiB // SCALE
MAX_TOKENIZING_BYTES = 8 * MiB // SCALE
MAX_HELD_BODY_BYTES = 128 * MiB // SCALE
RSS_PEAK_BOUND_MB = 1300 // SCALE
RSS_AFTER_BOUND_MB = 250 // SCALE
CHATS = 4  # concurrent chats of CHAT_BYTES: at full scale, 4 alone went over 2 GB before the bounds
CHAT_BYTES = 20 * MiB // SCALE  # five times counting.exact_count_max_bytes
UNDER_CHATS = 8  # concurrent chats just under exact_count_max_bytes, all counted exactly (issue 23)
UNDER_CHAT_BYTES = EXACT_COUNT_MAX_BYTES * 39 // 40
UNDER_PEAK_BOUND_MB = 4400 // SCALE
"""Tokenized two at a time they peak higher than chats that are only estimated, and noisily: measured here (quarter
scale, 2 busy cores) +320-490 MB with the tokenizing budget, +605 MB without it (full scale before: +2.2 GB peak).
The peak bound is loose (twice the full-scale growth, scaled) so a busy machine does not fail it; what the budget
and the heap trim change is asserted by the log and by what stays after: +30-150 MB, and +394 MB without them."""
UNDER_AFTER_BOUND_MB = 800 // SCALE
BODIES = 12  # concurrent bodies of BODY_BYTES: over three times what max_held_body_bytes holds at once
BODY_BYTES = 30 * MiB // SCALE
NAMES = 400  # distinct model names: 25 times the bound on unlisted counter chains
HELD_BODY_WAIT_S = 0.2  # how long an overflowing body waits for room before its 503 (default 2 s)
PROC = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")


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


@dataclass
class Kvgate:
    """``kvgate serve`` running for the module's attacks, its RSS once its tokenizer is loaded, and its log."""

    url: str
    pid: int
    log: list[str]
    baseline_mb: float = 0.0

    def rss_mb(self) -> float:
        return _rss_mb(self.pid)


class PeakRss:
    """The highest RSS of a process while the block runs, read every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.mb = _rss_mb(pid)
        self._polling = True
        self._poller: asyncio.Task[None] | None = None

    async def _poll(self) -> None:
        while self._polling:
            self.mb = max(self.mb, _rss_mb(self.pid))
            await asyncio.sleep(0.02)  # the sampling period

    async def __aenter__(self) -> PeakRss:
        self._poller = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self._polling = False
        assert self._poller is not None
        await self._poller
        self.mb = max(self.mb, _rss_mb(self.pid))


SMALL = {"model": EXACT_MODEL, "stream": False, "messages": [{"role": "user", "content": "Hello there"}]}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def kvgate(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Kvgate]:
    async with running(FakeLLM(Script(models=(EXACT_MODEL,)))) as fake:
        config = tmp_path_factory.mktemp("bounded-memory") / "kvgate.toml"
        config.write_text(
            f"[server]\nheld_body_wait_s = {HELD_BODY_WAIT_S}\nmax_held_body_bytes = {MAX_HELD_BODY_BYTES}\n"
            f'[counting]\ncache_dir = "{SESSION_CACHE_DIR}"\nexact_count_max_bytes = {EXACT_COUNT_MAX_BYTES}\n'
            f"max_tokenizing_bytes = {MAX_TOKENIZING_BYTES}\n"
            f'[models."{EXACT_MODEL}"]\ngguf_path = "{vocab_path(EXACT_VOCAB)}"\n'
            f'[[backends]]\nname = "fake"\nkind = "ollama"\nurl = "{fake.url}"\n'
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0",
            stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
        )
        assert process.stderr is not None
        stderr = process.stderr
        log: list[str] = []
        drainer: asyncio.Task[None] | None = None
        try:
            # kvgate loads a tokenizer on the first count; converted meanwhile into its cache (memory, not
            # conversion, is tested), while kvgate starts
            assert warmed_cache_dir(EXACT_VOCAB) == SESSION_CACHE_DIR
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
            running_kvgate = Kvgate(url, process.pid, log)
            async with aiohttp.ClientSession() as http:

                async def tokenizer_loaded() -> bool:  # it loads meanwhile
                    return await _counter(http, url) == "gguf; exact"

                try:
                    await until(tokenizer_loaded, timeout_s=10, interval_s=0.02)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}: {''.join(log)}") from None
            readings = [running_kvgate.rss_mb()]  # the baseline: RSS once it holds still (the load's threads done)
            deadline = time.monotonic() + 1
            while time.monotonic() < deadline and (len(readings) < 3 or max(readings[-3:]) - min(readings[-3:]) > 1):
                await asyncio.sleep(0.05)  # a settling read, not a wait for a state: RSS may never hold still
                readings.append(running_kvgate.rss_mb())
            running_kvgate.baseline_mb = readings[-1]
            yield running_kvgate
        finally:
            if process.returncode is None:
                process.terminate()
                await process.wait()
            if drainer is not None:
                drainer.cancel()


async def _counter(http: aiohttp.ClientSession, url: str) -> str:
    async with http.post(f"{url}/api/chat", json=SMALL) as response:
        assert response.status == 200
        return response.headers["X-Kvgate-Counter"]


async def _post(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, bytes, str | None]:
    async with http.post(f"{url}/api/chat", data=io.BytesIO(body),
                         headers={"Content-Type": "application/json"}) as response:
        return response.status, await response.read(), response.headers.get("Retry-After")


async def _after_attack(kvgate: Kvgate, peak: PeakRss, what: str, peak_bound_mb: float = RSS_PEAK_BOUND_MB,
                        after_bound_mb: float = RSS_AFTER_BOUND_MB) -> None:
    """The peak stayed under the bound; once the attack is over, with kvgate serving ordinary requests again (bursts
    of small chats, still counted exactly, on new connections), RSS returns near the baseline; no traceback logged."""
    deadline = time.monotonic() + 5
    async with aiohttp.ClientSession() as http:
        while True:  # freed memory goes back to the system as the allocator and the collector run
            assert set(await asyncio.gather(*(_counter(http, kvgate.url) for _ in range(32)))) == {"gguf; exact"}
            after_mb = kvgate.rss_mb()
            if after_mb < kvgate.baseline_mb + after_bound_mb or time.monotonic() > deadline:
                break
    print(f"\nkvgate RSS: baseline {kvgate.baseline_mb:.0f} MB; {what}: peak {peak.mb:.0f} MB, after {after_mb:.0f} MB")
    assert peak.mb < kvgate.baseline_mb + peak_bound_mb
    assert after_mb < kvgate.baseline_mb + after_bound_mb
    assert "Traceback" not in "".join(kvgate.log)


@PROC
@pytest.mark.asyncio(loop_scope="module")
async def test_concurrent_chats_over_the_exact_count_bound_keep_rss_bounded(kvgate: Kvgate) -> None:
    """Chats to a model with an exact tokenizer, over counting.exact_count_max_bytes: estimated, never tokenized
    whole, and (Ollama would cut them silently) cut head-and-tail to the context, each count of the cut bounded by
    the target (fitting/head_tail.py MAX_CHARS_PER_TOKEN), or refused 503 in Ollama's format."""
    big = _text(CHAT_BYTES, 1)
    chats = [json.dumps({"model": EXACT_MODEL, "stream": False,
                         "messages": [{"role": "user", "content": f"{i} {big}"}]}).encode() for i in range(CHATS)]
    del big
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with PeakRss(kvgate.pid) as peak:
            results = await asyncio.gather(*(_post(http, kvgate.url, body) for body in chats))
        del chats
        for status, body, _ in results:
            assert status in (200, 503), (status, body[:200])
            if status == 503:
                assert _is_ollama_error(body)
    await _after_attack(kvgate, peak, f"{CHATS} x {CHAT_BYTES / MiB:g} MiB chats, answered "
                        f"{sorted(status for status, _, _ in results)}")


@PROC
@pytest.mark.asyncio(loop_scope="module")
async def test_concurrent_bodies_over_the_held_body_budget_keep_rss_bounded(kvgate: Kvgate) -> None:
    """The body budget holds as many bodies at once as fit; the others wait held_body_wait_s, then get 503 with
    Retry-After. Every client sends half its body, then the rest once the overflow is answered: slow senders, so
    the bodies that got room are still held while the others wait (at full scale, 30 MiB in flight was slow
    enough; 7.5 MiB is not). Bytes are taken as they arrive (issue 23), so the first halves of more bodies fit
    than whole ones; of those, a body that can't take its next chunk in time gives its bytes back, and at least as
    many as fit whole are answered."""
    blob = (b'{"model": "' + EXACT_MODEL.encode() + b'", "stream": false, "messages": [{"role": "user", '
            b'"content": "' + b"x" * (BODY_BYTES - 200) + b'"}]}')
    fitting = MAX_HELD_BODY_BYTES // len(blob)
    answered = 0
    rest = asyncio.Event()

    async def slowly() -> AsyncIterator[bytes]:
        yield blob[:len(blob) // 2]
        await rest.wait()
        yield blob[len(blob) // 2:]

    async def post(http: aiohttp.ClientSession) -> tuple[int, bytes, str | None]:
        nonlocal answered
        headers = {"Content-Type": "application/json", "Content-Length": str(len(blob))}
        async with http.post(f"{kvgate.url}/api/chat", data=slowly(), headers=headers) as response:
            answer = response.status, await response.read(), response.headers.get("Retry-After")
        answered += 1
        if answered == 1:  # the first overflow: the others that found no room are answered within the wait
            asyncio.get_running_loop().call_later(HELD_BODY_WAIT_S + 0.5, rest.set)
        return answer

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with PeakRss(kvgate.pid) as peak:
            unstuck = asyncio.get_running_loop().call_later(30, rest.set)  # a failure, not a hang
            results = await asyncio.gather(*(post(http) for _ in range(BODIES)))
            unstuck.cancel()
        statuses = sorted(status for status, _, _ in results)
        # the bodies that got room: over exact_count_max_bytes, estimated; Ollama would cut them silently, so they
        # are cut head-and-tail to the context (announced) and answered
        assert set(statuses) == {200, 503} and statuses.count(200) >= fitting, [(s, b[:200]) for s, b, _ in results]
        for status, body, retry_after in results:
            if status == 503:
                assert _is_ollama_error(body)
                assert retry_after is not None and int(retry_after) >= 1
                assert b"max_held_body_bytes" in body
    await _after_attack(kvgate, peak, f"{BODIES} x {BODY_BYTES / MiB:g} MiB bodies, answered {statuses}")


@PROC
@pytest.mark.asyncio(loop_scope="module")
async def test_many_made_up_model_names_keep_rss_and_metrics_bounded(kvgate: Kvgate) -> None:
    """Distinct model names on a chat route (404) and /kvgate/count (counted, never kept each)."""
    seen: dict[int, int] = {}
    gate = asyncio.Semaphore(64)

    async def named(http: aiohttp.ClientSession, i: int) -> None:
        name = f"made-up-{i}-" + "m" * 100
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
        path = ("/v1/chat/completions", "/kvgate/count?route=/v1/chat/completions")[i % 2]
        async with gate, http.post(f"{kvgate.url}{path}", json=body) as response:
            data = await response.json()
            seen[response.status] = seen.get(response.status, 0) + 1
            if response.status != 200:
                assert isinstance(data["error"]["message"], str)  # OpenAI's format

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with PeakRss(kvgate.pid) as peak:
            await asyncio.gather(*(named(http, i) for i in range(NAMES)))
        assert set(seen) <= {200, 404}, seen
        async with http.get(f"{kvgate.url}/kvgate/metrics") as response:
            assert response.status == 200
            assert "made-up-" not in await response.text()
    await _after_attack(kvgate, peak, f"{NAMES} model names, answered {seen}")


@PROC
@pytest.mark.asyncio(loop_scope="module")
async def test_concurrent_chats_just_under_the_exact_count_bound_keep_rss_bounded(kvgate: Kvgate) -> None:
    """Chats just under counting.exact_count_max_bytes are tokenized whole; counting.max_tokenizing_bytes lets two
    be tokenized at a time, and the others are estimated (flagged) once their count budget runs out (said in the
    log); once the counts are done the freed heap goes back to the system. Before, 8 x 3.9 MiB at full scale took
    RSS from 224 MB to 2.4 GB and kept 1.8 GB. Last of the module's attacks: what it leaves is not the others'."""
    chats = [json.dumps({"model": EXACT_MODEL, "stream": False,
                         "messages": [{"role": "user", "content": _text(UNDER_CHAT_BYTES - 100, 10 + i)}]}).encode()
             for i in range(UNDER_CHATS)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with PeakRss(kvgate.pid) as peak:
            results = await asyncio.gather(*(_post(http, kvgate.url, body) for body in chats))
        del chats
        for status, body, _ in results:
            assert status in (200, 503), (status, body[:200])
    assert "counting.max_tokenizing_bytes" in "".join(kvgate.log)  # the budget turned some counts into estimates
    await _after_attack(kvgate, peak, f"{UNDER_CHATS} x {UNDER_CHAT_BYTES / MiB:.2f} MiB chats, answered "
                        f"{sorted(status for status, _, _ in results)}", peak_bound_mb=UNDER_PEAK_BOUND_MB,
                        after_bound_mb=UNDER_AFTER_BOUND_MB)


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
    await asyncio.sleep(0.05)  # a quarter of wait_s: it is still waiting then
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
    kept = upstream_request_headers(incoming, Hop("h", "r"), client_ip=None)
    dropped = upstream_request_headers(incoming, Hop("h", "r"), client_ip=None,
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
    async with running(FakeLLM(Script(models=(EXACT_MODEL,)))) as fake, \
            running_gateway([{"name": "f", "kind": "ollama", "url": fake.url}],
                            models={EXACT_MODEL: {"gguf_path": str(vocab_path(EXACT_VOCAB))}},
                            counting={"cache_dir": str(warmed_cache_dir(EXACT_VOCAB)),
                                      "exact_count_max_bytes": 4096}) as url, \
            aiohttp.ClientSession() as http:

        async def tokenizer_loaded() -> bool:  # it loads meanwhile
            async with http.post(f"{url}/api/chat", json=SMALL) as response:
                return response.headers["X-Kvgate-Counter"] == "gguf; exact"

        await until(tokenizer_loaded, timeout_s=20, interval_s=0.02)
        large = {**SMALL, "messages": [{"role": "user", "content": "word " * 2000}]}  # 10,000 bytes
        async with http.post(f"{url}/api/chat", json=large) as response:
            assert response.status == 200
            assert response.headers["X-Kvgate-Counter"] == "estimate; estimate"
            prompt = int(response.headers["X-Kvgate-Prompt-Tokens"])
            assert prompt >= 10_000 / 3  # bytes / estimate_bytes_per_token, plus the margin
            assert int(response.headers["X-Kvgate-Reserved-Tokens"]) > prompt


async def test_counter_chains_for_unlisted_names_are_bounded() -> None:
    from gateway.app import PROMPT_COUNTER, create_app, start_server
    from gateway.config.settings import load_settings
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
