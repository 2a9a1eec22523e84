"""Admission: decision time with 1,000 active reservations, and goodput through kvgate against an upper bound.

    python -m bench.admission [--quick] [--json]

Part 1 (pure, bench/admission_planner.py): ``plan(cost, pool, ledger.snapshot(key), policy)`` with 1,000 live
reservations in 4 split (Ollama) and 4 unified (llama-server) pools, every call timed alone; median, p90, p99.
Target: median decision <= 50 us.

Part 2 (loopback only): a bounded closed workload on the simulated Ollama (``kvgate sim``, its own process), sent
straight at it and through ``kvgate serve`` (its own process) in alternating rounds, so machine noise hits both alike:

    N clients, each sending M identical non-streaming chats one after the other (stream=False,
    options.num_predict = O, the simulator answering exactly O tokens: --response-tokens O:O);
    the simulator runs K = OLLAMA_NUM_PARALLEL sequences at once, prompt at PS tokens/s, output at GS tokens/s
    per sequence, time_scale TS simulated seconds per real second; N = 2K, so kvgate really queues.

Goodput = tokens of completed requests (prompt_eval_count + eval_count of every 200 answer) / wall time of the round.

The upper bound, from first principles. The simulator charges each sequence P / PS for its prompt and O / GS for its
output, in simulated seconds, whatever else runs (a slot is a semaphore; sequences do not slow each other down), and
runs at most K sequences at once. So one request occupies a slot for

    c = (P / PS + O / GS) / TS   real seconds,

P being the prompt as the simulator counts it (its tokenizer, the chat template included: the prompt_eval_count it
reports). R = N x M requests of equal cost on K slots need at least ceil(R / K) slot-rounds, and no client can go
faster than its own M requests one after the other (M x c, never more than ceil(R / K) x c here since N >= K). So
no server with these speeds, and no gateway, finishes the round before

    T* = max(ceil(R / K), M) x c,   and goodput <= R x (P + O) / T*.

The bound assumes a free network, an instant HTTP stack and a slot refilled the instant it frees: what kvgate and
the direct path lose against it is the client's and kvgate's per-request round trips, the gap between one request
leaving a slot and the next taking it, and the simulator's pacing (it sleeps in steps of 2 ms real; a sequence can
end up to one step early, so the measured direct rate may touch 100%). Target: kvgate's goodput >= 90% of the
bound (the median round). The direct rate is the yardstick for what the HTTP path alone costs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.admission_planner import TARGET_MEDIAN_US, Timing, render_planner, run_planner
from bench.hops import free_port
from bench.overhead import _wait_ready

MODEL = "llama3.1:8b"
CONTEXT = 4096
TARGET_RATIO = 0.90
PROMPT = ("You are a careful assistant. Summarise the following notes about KV caches, slots and queues in one "
          "short paragraph. " * 6).strip()


@dataclass(frozen=True)
class Workload:
    clients: int  # N
    per_client: int  # M
    slots: int  # K, OLLAMA_NUM_PARALLEL
    output_tokens: int  # O: num_predict, and the simulator's answer length
    prompt_speed: float  # PS, tokens/s
    gen_speed: float  # GS, tokens/s per sequence
    time_scale: float  # TS, simulated seconds per real second
    rounds: int

    @property
    def requests(self) -> int:
        return self.clients * self.per_client

    def request_s(self, prompt_tokens: int) -> float:
        """c: real seconds one request holds a slot."""
        return (prompt_tokens / self.prompt_speed + self.output_tokens / self.gen_speed) / self.time_scale

    def slot_rounds(self) -> int:
        return max(math.ceil(self.requests / self.slots), self.per_client)

    def best_makespan_s(self, prompt_tokens: int) -> float:
        """T*: no round of this workload can finish sooner."""
        return self.slot_rounds() * self.request_s(prompt_tokens)

    def bound_tokens_per_s(self, prompt_tokens: int) -> float:
        return self.requests * (prompt_tokens + self.output_tokens) / self.best_makespan_s(prompt_tokens)


DEFAULT = Workload(clients=8, per_client=8, slots=4, output_tokens=48, prompt_speed=4000.0, gen_speed=60.0,
                   time_scale=8.0, rounds=5)
QUICK = Workload(clients=8, per_client=3, slots=4, output_tokens=48, prompt_speed=4000.0, gen_speed=60.0,
                 time_scale=8.0, rounds=2)


@dataclass
class Round:
    """One run of the whole workload against one URL."""

    wall_s: float
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    prompt_counts: set[int] = field(default_factory=set)
    output_counts: set[int] = field(default_factory=set)
    latencies_s: list[float] = field(default_factory=list)
    queue_waits_s: list[float] = field(default_factory=list)  # kvgate's X-Kvgate-Queue-Wait
    sim_total_s: list[float] = field(default_factory=list)  # the simulator's total_duration, in real seconds

    @property
    def goodput(self) -> float:
        return self.tokens / self.wall_s


async def run_round(http: aiohttp.ClientSession, base: str, work: Workload) -> Round:
    body = orjson.dumps({"model": MODEL, "stream": False, "messages": [{"role": "user", "content": PROMPT}],
                         "options": {"num_predict": work.output_tokens}})
    result = Round(0.0)

    async def client() -> None:
        for _ in range(work.per_client):
            start = time.perf_counter()
            async with http.post(f"{base}/api/chat", data=body, headers={"Content-Type": "application/json"}) as r:
                raw = await r.read()
                wait = r.headers.get("X-Kvgate-Queue-Wait")
                status = r.status
            result.latencies_s.append(time.perf_counter() - start)
            answer = orjson.loads(raw) if status == 200 else {}
            if status != 200 or not answer.get("done"):
                result.failed += 1
                continue
            result.completed += 1
            result.tokens += int(answer["prompt_eval_count"]) + int(answer["eval_count"])
            result.prompt_counts.add(int(answer["prompt_eval_count"]))
            result.output_counts.add(int(answer["eval_count"]))
            result.sim_total_s.append(answer["total_duration"] / 1e9 / work.time_scale)
            if wait is not None:
                result.queue_waits_s.append(float(wait))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(work.clients)))
    result.wall_s = time.perf_counter() - start
    return result


async def _prompt_tokens(http: aiohttp.ClientSession, base: str, work: Workload) -> int:
    """P: the simulator's own count of the prompt (loads the model on the first call)."""
    body = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": PROMPT}],
            "options": {"num_predict": work.output_tokens}}
    async with http.post(f"{base}/api/chat", json=body) as response:
        answer = await response.json()
        assert response.status == 200, answer
        assert answer["eval_count"] == work.output_tokens, answer
        return int(answer["prompt_eval_count"])


async def _wait_for_counter(http: aiohttp.ClientSession, gateway: str, work: Workload, deadline_s: float = 60.0) -> str:
    """Until kvgate counts with the model's own tokenizer (fetched from /api/show and built once)."""
    body = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": PROMPT}],
            "options": {"num_predict": 1}}
    counter = ""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and not counter.startswith("gguf"):
        async with http.post(f"{gateway}/api/chat", json=body) as response:
            await response.read()
            counter = response.headers.get("X-Kvgate-Counter", "")
    return counter


async def _fixed_cost_s(http: aiohttp.ClientSession, base: str, count: int = 30) -> float:
    """Median latency of a 1-token chat (num_predict=1), one at a time: the path's per-request cost."""
    body = orjson.dumps({"model": MODEL, "stream": False, "messages": [{"role": "user", "content": PROMPT}],
                         "options": {"num_predict": 1}})
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        async with http.post(f"{base}/api/chat", data=body, headers={"Content-Type": "application/json"}) as r:
            await r.read()
            assert r.status == 200, r.status
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def _sim_reloads(http: aiohttp.ClientSession, sim: str) -> int:
    async with http.get(f"{sim}/sim/stats") as response:
        return int((await response.json())["reloads"])


@dataclass
class Goodput:
    work: Workload
    prompt_tokens: int
    direct: list[Round]
    gated: list[Round]
    reloads: int
    counter: str  # kvgate's X-Kvgate-Counter: how it counted the prompt
    fixed_s: dict[str, float]  # median latency of a 1-token chat at concurrency 1, per path
    cpu_per_request_s: dict[str, float]  # CPU time per request of the simulator (each path) and of kvgate

    def fixed_over_c_s(self, path: str) -> float:
        """What a 1-token chat costs on the path beyond its simulated time: the per-request price of the path."""
        w = self.work
        return self.fixed_s[path] - (self.prompt_tokens / w.prompt_speed + 1 / w.gen_speed) / w.time_scale

    @property
    def bound(self) -> float:
        return self.work.bound_tokens_per_s(self.prompt_tokens)

    def median_ratio(self, rounds: list[Round]) -> float:
        return statistics.median(r.goodput for r in rounds) / self.bound


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


async def measure_goodput(sim: str, gateway: str, work: Workload, pids: dict[str, int] | None = None) -> Goodput:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        await _wait_ready(f"{sim}/api/tags", 30.0)
        await _wait_ready(f"{gateway}/kvgate/health", 30.0)
        prompt_tokens = await _prompt_tokens(http, sim, work)
        warm = dataclasses.replace(work, per_client=1, rounds=1)
        await run_round(http, gateway, warm)  # kvgate probes the pool and builds its tokenizer
        await run_round(http, sim, warm)
        counter = await _wait_for_counter(http, gateway, work)
        fixed = {name: await _fixed_cost_s(http, url) for name, url in (("direct", sim), ("kvgate", gateway))}
        direct, gated = [], []
        pids = pids or {}
        cpu = dict.fromkeys(("sim direct", "sim via kvgate", "kvgate"), 0.0)
        for _ in range(work.rounds):  # alternate, so drift hits both paths alike
            sim0 = cpu_s(pids.get("sim"))
            direct.append(await run_round(http, sim, work))
            sim1, gate1 = cpu_s(pids.get("sim")), cpu_s(pids.get("kvgate"))
            gated.append(await run_round(http, gateway, work))
            cpu["sim direct"] += sim1 - sim0
            cpu["sim via kvgate"] += cpu_s(pids.get("sim")) - sim1
            cpu["kvgate"] += cpu_s(pids.get("kvgate")) - gate1
        per_request = {name: seconds / (work.rounds * work.requests) for name, seconds in cpu.items()}
        return Goodput(work, prompt_tokens, direct, gated, await _sim_reloads(http, sim), counter, fixed,
                       per_request)


def _ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


def render_goodput(g: Goodput) -> str:
    w, p = g.work, g.prompt_tokens
    c = w.request_s(p)
    lines = [
        f"part 2: goodput on the simulated Ollama ({MODEL}), {w.clients} clients x {w.per_client} chats, stream=False",
        f"  workload: K={w.slots} slots (OLLAMA_NUM_PARALLEL), P={p} prompt tokens (as the simulator counts them), "
        f"O={w.output_tokens} output tokens (num_predict), PS={w.prompt_speed:g} tok/s, GS={w.gen_speed:g} tok/s, "
        f"TS={w.time_scale:g}x",
        f"  bound: c = (P/PS + O/GS)/TS = ({p}/{w.prompt_speed:g} + {w.output_tokens}/{w.gen_speed:g})/{w.time_scale:g}"
        f" = {c * 1000:.1f} ms a request; T* = max(ceil(R/K), M) x c = max(ceil({w.requests}/{w.slots}), "
        f"{w.per_client}) x c = {w.best_makespan_s(p):.3f} s;",
        f"         goodput <= R x (P+O) / T* = {w.requests} x {p + w.output_tokens} / {w.best_makespan_s(p):.3f} "
        f"= {g.bound:.0f} tok/s (no slot ever idle, a free network and HTTP stack)",
    ]
    head = (f"  {'path':<10} {'tok/s (med)':>11} {'of bound':>8} {'wall s':>7} {'done':>5} {'failed':>6} "
            f"{'req ms':>7} {'sim ms':>7} {'gap/slot-round ms':>17} {'kvgate queue ms':>15}")
    lines += [head, "  " + "-" * (len(head) - 2)]
    for name, rounds in (("direct", g.direct), ("kvgate", g.gated)):
        goodput, wall_s = statistics.median(r.goodput for r in rounds), statistics.median(r.wall_s for r in rounds)
        gap_ms = (wall_s - w.best_makespan_s(p)) / w.slot_rounds() * 1000
        lats = [x for r in rounds for x in r.latencies_s]
        sims = [x for r in rounds for x in r.sim_total_s]
        waits = [x for r in rounds for x in r.queue_waits_s]
        lines.append(
            f"  {name:<10} {goodput:>11.0f} {goodput / g.bound:>8.1%} {wall_s:>7.3f} "
            f"{sum(r.completed for r in rounds):>5} {sum(r.failed for r in rounds):>6} {_ms(lats):>7.1f} "
            f"{_ms(sims):>7.1f} {gap_ms:>17.2f} {_ms(waits):>15.1f}"
        )
    counts = {n for r in g.direct + g.gated for n in r.prompt_counts}, {n for r in g.direct + g.gated for n in
                                                                         r.output_counts}
    lines.append(f"  (tok/s and wall: medians of {w.rounds} rounds each, alternating; req ms: median client "
                 "latency; sim ms: the simulator's total_duration in real ms, queueing in it included; gap: wall "
                 "time above T* per slot-round)")
    lines.append(f"  prompt counts seen {sorted(counts[0])}, output counts seen {sorted(counts[1])}, "
                 f"simulator reloads {g.reloads}")
    lines.append(f"  kvgate counted with: {g.counter}")
    direct_fixed, gated_fixed = g.fixed_over_c_s("direct") * 1000, g.fixed_over_c_s("kvgate") * 1000
    lines.append(f"  where the time goes: a 1-token chat at concurrency 1 takes {g.fixed_s['direct'] * 1000:.2f} ms "
                 f"direct, {g.fixed_s['kvgate'] * 1000:.2f} ms through kvgate; beyond its simulated time that is "
                 f"{direct_fixed:.2f} ms (client + simulator HTTP) and {gated_fixed:.2f} ms (+ kvgate: count, plan, "
                 "rewrite, forward; the simulator's pacer may end a sequence up to 2 ms early, hence a value below 0).")
    cpu = {name: f"{seconds * 1000:.2f} ms" for name, seconds in g.cpu_per_request_s.items()}
    lines.append(f"  CPU per request in the main rounds: kvgate {cpu['kvgate']}; the simulator {cpu['sim direct']} "
                 f"direct, {cpu['sim via kvgate']} via kvgate (one event loop each: kvgate's CPU per request, times "
                 f"the {w.slots} requests a slot-round hands over, is time in which a freed slot may wait).")
    lines.append("  Direct, the simulator parses and tokenizes a queued request while it waits for a slot, so a freed "
                 "slot is refilled at once; through kvgate the request waits in kvgate and reaches the simulator only "
                 "when a slot frees, so every slot-round pays that per-request price (the gap column).")
    ratio = g.median_ratio(g.gated)
    lines.append(f"target: kvgate goodput >= {TARGET_RATIO:.0%} of the bound: {ratio:.1%} -> "
                 f"{'PASS' if ratio >= TARGET_RATIO else 'FAIL'} (direct, same run: {g.median_ratio(g.direct):.1%})")
    return "\n".join(lines)


def goodput_json(g: Goodput) -> dict[str, Any]:
    def rounds(rs: list[Round]) -> list[dict[str, Any]]:
        return [{"wall_s": round(r.wall_s, 4), "completed": r.completed, "failed": r.failed, "tokens": r.tokens,
                 "goodput_tok_s": round(r.goodput, 1)} for r in rs]

    w = g.work
    return {
        "workload": {"clients": w.clients, "per_client": w.per_client, "slots": w.slots,
                     "prompt_tokens": g.prompt_tokens, "output_tokens": w.output_tokens,
                     "prompt_tokens_per_s": w.prompt_speed, "gen_tokens_per_s": w.gen_speed,
                     "time_scale": w.time_scale, "rounds": w.rounds},
        "bound": {"request_s": w.request_s(g.prompt_tokens), "best_makespan_s": w.best_makespan_s(g.prompt_tokens),
                  "tokens_per_s": g.bound},
        "direct": {"median_ratio": g.median_ratio(g.direct), "rounds": rounds(g.direct)},
        "kvgate": {"median_ratio": g.median_ratio(g.gated), "rounds": rounds(g.gated)},
        "simulator_reloads": g.reloads,
        "kvgate_counter": g.counter,
        "one_token_chat_ms": {path: round(v * 1000, 3) for path, v in g.fixed_s.items()},
        "cpu_per_request_ms": {name: round(v * 1000, 3) for name, v in g.cpu_per_request_s.items()},
        "target_ratio": TARGET_RATIO,
        "target_met": g.median_ratio(g.gated) >= TARGET_RATIO,
    }


def _wait_until_listening(port: int, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def start_sim(work: Workload) -> tuple[subprocess.Popen[bytes], str]:
    """The simulated Ollama serving ``MODEL`` with ``work``'s slots, speeds and answer length, on 127.0.0.1."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    sim = subprocess.Popen([
        sys.executable, "-m", "gateway", "sim", "--port", str(port), "--models", MODEL,
        "--num-parallel", str(work.slots), "--context-length", str(CONTEXT), "--keep-alive", "-1",
        "--load-time", "0.2", "--prompt-speed", str(work.prompt_speed), "--gen-speed", str(work.gen_speed),
        "--response-tokens", f"{work.output_tokens}:{work.output_tokens}", "--time-scale", str(work.time_scale),
        "--max-queue", "4096",
    ], env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_until_listening(port)  # so kvgate's first model listing finds it
    except RuntimeError:
        sim.terminate()
        sim.wait(timeout=10)
        raise
    return sim, f"http://127.0.0.1:{port}"


def start_gateway(sim_url: str, slots: int, config: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """``kvgate serve`` in front of the simulator on 127.0.0.1, without the caller's KVGATE_* settings; ``config``: a
    TOML file for everything but the backend (tenants, admission)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    backend = {"name": "sim", "kind": "ollama", "url": sim_url, "parallel": slots, "context_tokens": CONTEXT}
    gateway_env = {**env, "KVGATE_SERVER__LOG_LEVEL": "warning", "KVGATE_BACKENDS": json.dumps([backend])}
    extra = ["--config", config] if config else []
    gateway = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(port), *extra],
                               env=gateway_env)
    return gateway, f"http://127.0.0.1:{port}"


def start_processes(work: Workload) -> tuple[list[subprocess.Popen[bytes]], str, str]:
    """The simulator and kvgate, each in its own process on 127.0.0.1, without the caller's KVGATE_* settings."""
    sim, sim_url = start_sim(work)
    gateway, gateway_url = start_gateway(sim_url, work.slots)
    return [gateway, sim], sim_url, gateway_url


def main(argv: list[str] | None = None, *, planner: Callable[[int, int], list[Timing]] = run_planner) -> int:
    """``planner`` times the pure part; a test passes a cheaper one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer decisions, 3 chats a client, 2 rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    parser.add_argument("--time-scale", type=float, metavar="TS",
                        help=f"simulated seconds per real second (default {DEFAULT.time_scale:g}); lower: longer "
                        "requests, so kvgate's fixed per-request cost weighs less")
    parser.add_argument("--planner-only", action="store_true", help="part 1 only (no processes, no sockets)")
    args = parser.parse_args(argv)
    work = QUICK if args.quick else DEFAULT
    if args.time_scale is not None:
        work = dataclasses.replace(work, time_scale=args.time_scale)
    timings = planner(*((10_000, 2_000) if args.quick else (100_000, 20_000)))
    report: dict[str, Any] = {"planner": {"rows": [t.as_dict() for t in timings],
                                          "target_median_us": TARGET_MEDIAN_US,
                                          "target_met": timings[0].median_us <= TARGET_MEDIAN_US}}
    if not args.json:
        print(render_planner(timings), flush=True)
    if not args.planner_only:
        processes, sim_url, gateway_url = start_processes(work)
        try:
            pids = {"kvgate": processes[0].pid, "sim": processes[1].pid}
            goodput = asyncio.run(measure_goodput(sim_url, gateway_url, work, pids))
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=10)
        report["goodput"] = goodput_json(goodput)
        if not args.json:
            print()
            print(render_goodput(goodput))
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
