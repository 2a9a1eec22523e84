"""What a hop adds: latency and throughput direct, through kvgate and through other hops, side by side in one run.

    python -m bench.overhead [--quick] [--baseline DIR] [--only-kvgate]

Starts a fast fake Ollama (one Llama 3 model, loaded) and, each in its own process (bench/hops.py): ``kvgate serve``
in front of it, a bare aiohttp proxy with no kvgate logic (bench/bare_proxy.py: what any Python hop costs here),
and, where installed, nginx as a reverse proxy, kvgate with ``[shared_ledger]`` on a local Redis, two kvgate replicas
sharing one Redis (the client splits the load between them) and LiteLLM. It then measures, every hop in each round
and the order of the hops turned by one each round, so machine noise and a hop's place in the round hit all alike:
- a small non-streaming chat: median and p99 latency, requests per second, at concurrency 1 and 64, from this
  process's aiohttp client, and again with wrk where it is installed (a C client: a hop faster than Python's client
  is told apart from the client's own limit);
- a 500-chunk NDJSON stream: median and p99 time per stream, chunks per second, at concurrency 1 and 64.
It prints kvgate's table, every hop side by side (issue 26's table) and the targets: added median at c=1 at most
0.3 ms, requests/s at c=64 at least 10% of nginx's, stream chunks/s at c=1 at least 0.9 of direct, and with the
shared ledger at least 0.8x one unshared kvgate's requests/s. With ``--baseline DIR`` (a checkout of an earlier
commit, e.g. ``git worktree add /tmp/before <rev>``), that checkout's kvgate runs too and is compared side by side.
All traffic stays on 127.0.0.1; every loop is bounded in count or time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import orjson

from bench.hops import BARE, BASELINE, DIRECT, KVGATE, NGINX, SHARED, Hops, free_port
from bench.wrk_runs import TIMEOUT_S, Wrk, wrk_binary

STREAM_CHUNKS = 500
ROUNDS = 9


async def _wait_ready(url: str, deadline_s: float = 20.0) -> None:
    async with aiohttp.ClientSession() as http:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


@dataclass
class Result:
    latencies_s: list[float]
    wall_s: float
    units: int

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000

    @property
    def rate(self) -> float:
        return self.units / self.wall_s


async def _run(concurrency: int, per_worker: int, one: Callable[[], Awaitable[int]]) -> Result:
    latencies: list[float] = []
    units = 0

    async def worker() -> None:
        nonlocal units
        for _ in range(per_worker):
            start = time.perf_counter()
            done = await one()
            latencies.append(time.perf_counter() - start)
            units += done

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(latencies, time.perf_counter() - start, units)


SMALL = orjson.dumps({"model": "bench", "stream": False, "messages": [{"role": "user", "content": "hi"}]})


@dataclass(frozen=True)
class Target:
    """One hop as the client sees it: its URLs (several: the client spreads its requests over them), the route of a
    small chat (LiteLLM takes OpenAI's, every other hop Ollama's), and whether the Python client measures it too (a
    hop that takes tens of milliseconds a request is measured by wrk alone: its rounds are timed, not counted)."""

    urls: list[str]
    path: str = "/api/chat"
    small: bytes = SMALL
    python_client: bool = True


def _small(http: aiohttp.ClientSession, target: Target) -> Callable[[], Awaitable[int]]:
    urls = itertools.cycle(target.urls)

    async def one() -> int:
        url = next(urls) + target.path
        async with http.post(url, data=target.small, headers={"Content-Type": "application/json"}) as r:
            await r.read()
            assert r.status == 200
        return 1

    return one


def _stream(http: aiohttp.ClientSession, target: Target) -> Callable[[], Awaitable[int]]:
    body = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}],
                         "options": {"num_predict": STREAM_CHUNKS}})
    urls = itertools.cycle(target.urls)

    async def one() -> int:
        lines = 0
        async with http.post(f"{next(urls)}/api/chat", data=body, headers={"Content-Type": "application/json"}) as r:
            async for chunk in r.content.iter_any():  # count lines without splitting: a light client
                lines += chunk.count(b"\n")
        assert lines == STREAM_CHUNKS + 1, lines
        return STREAM_CHUNKS

    return one


@dataclass
class Row:
    """One case: the direct rounds merged, and for each proxy its rounds merged and its median per-round ratio."""

    name: str
    direct: Result
    through: dict[str, tuple[Result, float]]
    rounds: dict[str, list[Result]] = field(default_factory=dict)
    """Every hop's rounds, in order (round i of each hop was measured in the same turn)."""


async def measure(targets: dict[str, Target], quick: bool, rounds: int = ROUNDS) -> list[Row]:
    """The Python-client cases, every hop in each round, the hops' order turned each round (``_turned``)."""
    scale = 0.25 if quick else 1.0
    plans = [  # each round lasts about half a second, so one noisy moment can't decide a round
        ("small chat, c=1", 1, int(1500 * scale), _small),
        ("small chat, c=64", 64, int(40 * scale) or 1, _small),
        ("500-chunk stream, c=1", 1, int(150 * scale) or 2, _stream),
        ("500-chunk stream, c=64", 64, int(4 * scale) or 1, _stream),
    ]
    rows = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        for name, concurrency, per_worker, make in plans:
            here = {label: t for label, t in targets.items() if t.python_client}
            for target in here.values():  # warm every path
                await _run(concurrency, max(1, per_worker // 10), make(http, target))
            runs: dict[str, list[Result]] = {label: [] for label in here}
            for index in range(rounds):
                for label in _turned(list(here), index):
                    runs[label].append(await _run(concurrency, per_worker, make(http, here[label])))
            rows.append(_row(name, runs))
    return rows


def measure_wrk(wrk: Wrk, targets: dict[str, Target], quick: bool, rounds: int = ROUNDS,
                failures: dict[str, int] | None = None) -> list[Row]:
    """The small chats again, driven by wrk: the rate of a hop faster than this Python client. A hop's failed
    requests are added up in ``failures`` (a kvgate's fail the run: nothing here should fail). A slow hop (one the
    Python client does not measure: LiteLLM) is measured after the others, each of its rounds beside a direct one
    and followed by a wait until it has worked off what wrk left it, so its backlog never runs into another hop's
    round."""
    seconds = 1 if quick else 2  # wrk takes whole seconds
    failures = {} if failures is None else failures
    fast = {label: t for label, t in targets.items() if t.python_client}
    slow = {label: t for label, t in targets.items() if not t.python_client}
    direct = targets[DIRECT]
    rows = []
    for concurrency in (1, 64):
        for target in fast.values():  # warm
            wrk.run(target.urls, target.path, concurrency, 1)
        runs: dict[str, list[Result]] = {label: [] for label in targets}
        for index in range(rounds):
            for label in _turned(list(fast), index):
                runs[label].append(_wrk_round(wrk, label, fast[label], concurrency, seconds, failures))
        beside: dict[str, list[Result]] = {}
        for label, target in slow.items():
            beside[label] = []
            for _ in range(rounds):
                runs[label].append(_wrk_round(wrk, label, target, concurrency, seconds, failures))
                _drain(target)
                beside[label].append(_wrk_round(wrk, DIRECT, direct, concurrency, seconds, failures))
        rows.append(_row(f"small chat, c={concurrency} (wrk)", runs, beside))
    return rows


def _turned(labels: list[str], index: int) -> list[str]:
    """Round ``index``'s order: each hop goes first in turn (a fixed order measured kvgate right after direct in
    every round and its baseline after the bare proxy, and the c=1 comparison of the two moved with it)."""
    shift = index % len(labels)
    return labels[shift:] + labels[:shift]


def _wrk_round(wrk: Wrk, label: str, target: Target, concurrency: int, seconds: int,
               failures: dict[str, int]) -> Result:
    result = wrk.run(target.urls, target.path, concurrency, seconds)
    if result.failed and "kvgate" in label:
        raise RuntimeError(f"{label}: {result.failed} requests failed under wrk at c={concurrency}")
    if result.failed:
        failures[label] = failures.get(label, 0) + result.failed
    return Result([result.p50_ms / 1000], seconds, round(result.requests_per_s * seconds))


def _drain(target: Target, deadline_s: float = 120.0) -> None:
    """Until the hop answers a request at once again: what a load generator left queued there is done."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        start = time.monotonic()
        request = urllib.request.Request(target.urls[0] + target.path, data=target.small, method="POST",
                                         headers={"Content-Type": "application/json"})
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=deadline_s) as response:
            response.read()
        if time.monotonic() - start < 1.0:
            return


def _row(name: str, runs: dict[str, list[Result]], direct_for: dict[str, list[Result]] | None = None) -> Row:
    """The case's row: each hop's rounds merged, and the median of its ratios to the direct rounds beside them
    (``direct_for``: a hop measured in rounds of its own, with direct rounds of its own)."""
    direct = runs[DIRECT]
    through = {}
    for label, results in runs.items():
        if label != DIRECT:
            beside = (direct_for or {}).get(label, direct)
            ratios = [p.rate / d.rate for d, p in zip(beside, results, strict=True)]
            through[label] = (_merge(results), statistics.median(ratios))
    return Row(name, _merge(direct), through, runs)


def _merge(results: list[Result]) -> Result:
    """All latencies together; the rate of the median round (robust to a noisy neighbour in one round)."""
    median_round = sorted(results, key=lambda r: r.rate)[len(results) // 2]
    return Result([lat for r in results for lat in r.latencies_s], median_round.wall_s, median_round.units)


def render(rows: list[Row], missing: dict[str, str] | None = None) -> str:
    python_rows = [row for row in rows if "(wrk)" not in row.name]
    head = (f"{'case':<24} {'direct med ms':>13} {'kvgate med ms':>13} {'added ms':>9} {'direct p99':>10} "
            f"{'kvgate p99':>10} {'direct /s':>10} {'kvgate /s':>10} {'ratio':>6} {'bare proxy':>10}")
    lines = [head, "-" * len(head)]
    for row in python_rows:
        d, (g, ratio) = row.direct, row.through[KVGATE]
        bare_ratio = row.through[BARE][1] if BARE in row.through else float("nan")
        unit = "chunks" if "stream" in row.name else "req"
        lines.append(
            f"{row.name:<24} {d.median_ms:>13.3f} {g.median_ms:>13.3f} {g.median_ms - d.median_ms:>9.3f} "
            f"{d.p99_ms:>10.3f} {g.p99_ms:>10.3f} {d.rate:>10.0f} {g.rate:>10.0f} {ratio:>6.2f} {bare_ratio:>10.2f}"
            f"  ({unit}/s)"
        )
    lines.append("(the Python client; rates: the median round; ratio: the median of the per-round ratios to direct, "
                 "for kvgate and for a bare aiohttp proxy with no kvgate logic, bench/bare_proxy.py)")
    lines.extend(["", hops_table(rows, missing or {})])
    small1 = next(row for row in rows if row.name.startswith("small chat, c=1"))
    wrk1 = next((row for row in rows if row.name == "small chat, c=1 (wrk)"), small1)
    added = wrk1.through[KVGATE][0].median_ms - wrk1.direct.median_ms
    stream1 = next(row for row in rows if row.name == "500-chunk stream, c=1")
    lines.append("")
    verdict = "PASS" if added <= 0.3 else "FAIL"
    lines.append(f"target: added median latency at c=1 <= 0.3 ms: {added:.3f} ms -> {verdict}"
                 f" ({'wrk' if wrk1 is not small1 else 'the Python client'})")
    wrk64 = next((row for row in rows if row.name == "small chat, c=64 (wrk)"), None)
    if wrk64 is not None and NGINX in wrk64.through:
        share = wrk64.through[KVGATE][0].rate / wrk64.through[NGINX][0].rate
        lines.append(f"target: requests/s at c=64 >= 10% of nginx's: {share:.1%} -> "
                     f"{'PASS' if share >= 0.1 else 'FAIL'}")
    stream_ratio = stream1.through[KVGATE][1]
    lines.append(f"target: stream chunks/s at c=1 >= 0.9 of direct: {stream_ratio:.2f} -> "
                 f"{'PASS' if stream_ratio >= 0.9 else 'FAIL'}")
    if BARE in stream1.through:
        lines.append(f"        the bare aiohttp proxy, same case, same run: {stream1.through[BARE][1]:.2f} of direct")
    wrk_or_python64 = wrk64 or next(row for row in rows if row.name == "small chat, c=64")
    if SHARED in wrk_or_python64.through:
        shared = wrk_or_python64.through[SHARED][0].rate / wrk_or_python64.through[KVGATE][0].rate
        lines.append(f"target: with the shared ledger >= 0.8x the requests/s of one unshared kvgate at c=64: "
                     f"{shared:.2f}x -> {'PASS' if shared >= 0.8 else 'FAIL'}")
    if BASELINE in small1.through:
        lines.extend(["", _compare(python_rows)])
    return "\n".join(lines)


def hops_table(rows: list[Row], missing: dict[str, str]) -> str:
    """Every hop side by side (issue 26's table): added median at c=1, requests/s at c=64 and its share of direct's
    and nginx's, and streamed chunks/s at c=1 as a share of direct's; wrk's small chats where wrk ran."""
    by_name = {row.name: row for row in rows}
    c1 = by_name.get("small chat, c=1 (wrk)") or by_name["small chat, c=1"]
    c64 = by_name.get("small chat, c=64 (wrk)") or by_name["small chat, c=64"]
    stream = by_name.get("500-chunk stream, c=1")
    driver = "wrk" if "(wrk)" in c1.name else "the Python client"
    head = (f"{'hop':<28} {'added p50 c=1 ms':>16} {'req/s c=64':>11} {'of direct':>10} {'of nginx':>9} "
            f"{'stream c=1 of direct':>21}")
    lines = [f"every hop side by side (small chats: {driver}; streams: the Python client)", head, "-" * len(head)]
    nginx = c64.through.get(NGINX)
    lines.append(f"{DIRECT:<28} {0.0:>16.3f} {c64.direct.rate:>11.0f} {1.0:>10.2f} "
                 f"{(c64.direct.rate / nginx[0].rate if nginx else float('nan')):>9.2f} {1.0:>21.2f}")
    for label in c64.through:
        added = c1.through[label][0].median_ms - c1.direct.median_ms
        rate, of_direct = c64.through[label][0].rate, c64.through[label][1]
        of_nginx = rate / nginx[0].rate if nginx else float("nan")
        streamed = stream.through[label][1] if stream is not None and label in stream.through else float("nan")
        lines.append(f"{label:<28} {added:>+16.3f} {rate:>11.0f} {of_direct:>10.2f} {of_nginx:>9.2f} {streamed:>21.2f}")
    for label, why in missing.items():
        lines.append(f"{label:<28} not measured: {why}")
    return "\n".join(lines)


def _compare(rows: list[Row]) -> str:
    """This checkout's kvgate beside the baseline checkout's, measured in the same rounds."""
    head = f"{'case':<24} {'before med ms':>13} {'now med ms':>10} {'before /s':>10} {'now /s':>10} {'now/before':>10}"
    lines = [f"against the baseline checkout ({BASELINE}):", head, "-" * len(head)]
    for row in rows:
        before, now = row.through[BASELINE][0], row.through[KVGATE][0]
        lines.append(f"{row.name:<24} {before.median_ms:>13.3f} {now.median_ms:>10.3f} {before.rate:>10.0f} "
                     f"{now.rate:>10.0f} {_paired(row):>10.2f}")
    lines.append("(now/before: the median of the rounds' ratios, each round's two measured in that round)")
    return "\n".join(lines)


def _paired(row: Row) -> float:
    """now/before as the median of each round's own ratio (the rates of the median rounds where the row has no
    rounds: a table made from fixed rows)."""
    now, before = row.rounds.get(KVGATE), row.rounds.get(BASELINE)
    if not now or not before:
        return row.through[KVGATE][0].rate / row.through[BASELINE][0].rate
    return statistics.median(n.rate / b.rate for n, b in zip(now, before, strict=True))


async def _wait_for_tokenizer(gateway: str, deadline_s: float = 60.0) -> str:
    """Until kvgate counts with the model's own tokenizer (fetched from /api/show and built once)."""
    counter = ""
    async with aiohttp.ClientSession() as http:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and not counter.startswith("gguf"):
            async with http.post(f"{gateway}/api/chat", data=SMALL) as response:
                await response.read()
                counter = response.headers.get("X-Kvgate-Counter", "")
            await asyncio.sleep(0.1)
    return counter


async def amain(hops: Hops, quick: bool, use_wrk: bool) -> None:
    targets: dict[str, Target] = {}
    for label, urls in hops.urls.items():
        gateway = label.startswith("kvgate") or label.startswith("2 kvgate")
        chat, ready = hops.routes.get(label, ("/api/chat", "/kvgate/health" if gateway else "/api/tags"))
        for url in urls:
            await _wait_ready(url + ready, deadline_s=90.0)
            if gateway:
                print(f"{label} at {url} counts with: {await _wait_for_tokenizer(url)}")
        targets[label] = Target(urls, chat, python_client=chat == "/api/chat")
    binary = wrk_binary() if use_wrk else None
    for label in [label for label, target in targets.items() if not target.python_client and binary is None]:
        del targets[label]
        hops.missing[label] = "measured by wrk only, and wrk is not installed"
    for label, why in hops.missing.items():
        print(f"{label}: not measured: {why}")
    rounds = 3 if quick else ROUNDS
    rows = await measure(targets, quick, rounds)
    if binary is not None:
        wrk = Wrk(binary, SMALL)
        failures: dict[str, int] = {}
        try:
            rows.extend(measure_wrk(wrk, targets, quick, rounds, failures))
        finally:
            wrk.close()
        for label, failed in failures.items():
            print(f"{label}: {failed} requests failed under wrk (not 2xx, or no answer within {TIMEOUT_S} s)")
    elif use_wrk:
        print("wrk: not installed (apt-get install wrk): the small chats' rates are the Python client's")
    print(render(rows, hops.missing))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests (a smoke run)")
    parser.add_argument("--baseline", metavar="DIR", help="also run the kvgate of this checkout, side by side")
    parser.add_argument("--only-kvgate", action="store_true",
                        help="direct, kvgate and the bare proxy only (no nginx, shared ledger, replicas or wrk)")
    args = parser.parse_args()
    hops = Hops(free_port(), baseline=args.baseline)
    try:
        hops.start(extras=not args.only_kvgate)
        asyncio.run(amain(hops, args.quick, use_wrk=not args.only_kvgate))
    finally:
        hops.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
