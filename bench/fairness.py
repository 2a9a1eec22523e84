"""Fairness between tenants: one floods the queue, two trickle; fair order against arrival order, side by side.

    python -m bench.fairness [--quick] [--json] [--rounds N] [--virtual-only]

Part 1 (virtual time, bench/fair_sim.py): kvgate's real waiting room on a virtual clock, a 32,768-token unified
pool. The scenarios of tests/admission/test_fair_queue.py (a tenant floods it with 200 requests of 8,000 tokens
held 8 s each while two others send a trickle, are backlogged, or one of each), in fair and arrival order, and a
trickle's median wait against the size of the flood (0, 50, 200 requests).

Part 2 (real processes, loopback only): ``kvgate serve`` in front of the simulated Ollama (``kvgate sim``), each in
its own process on 127.0.0.1, two kvgates on the one simulator, configured alike (a temporary TOML file) except
``admission.queue_order``: "fair" in one, "arrival" in the other. Three tenants with API keys: flood (weight 1),
a (weight 1), b (weight 2). One round per order, the orders one after the other:

    flood   F non-streaming chats sent at once, options.num_predict = OF (the simulator answers exactly OF
            tokens), so they hold the K = OLLAMA_NUM_PARALLEL slots for F / K rounds of c real seconds each;
    a, b    N non-streaming chats each, one every E seconds from shortly after the flood (b half a gap later),
            num_predict OA and OB (b's are larger: its weight is 2), open loop (nobody waits for an answer).

The simulated Ollama has a split pool: K slots of CONTEXT tokens each, one sequence a slot. kvgate reserves each
sequence's prompt + num_predict in its slot, and the fair order shares those reserved tokens between tenants by
weight; the slots are the real capacity, so fairness here is in reserved tokens per slot (the answers are generation
bound, so a request's tokens and its slot time are in proportion and the two measures agree).

Measured per tenant, from the answers: tokens served (prompt_eval_count + eval_count of each answer, counted when
kvgate admitted it: the send time + kvgate's X-Kvgate-Queue-Wait) inside the *contended window* (the first request
until the first tenant has its last request admitted: while the flood is still queued, every tenant has work), its
share of them against its fair share (weighted max-min, ``bench.fair_sim.max_min_fair``: all it asked when it asks
less than its weighted share, as a trickle does), and the median and p90 of X-Kvgate-Queue-Wait.

Targets, fair order (the exit code is 1 if one is missed): every request answered 200; each trickle tenant (a, b)
gets >= 95% of its fair share of the served tokens, and its median wait stays below one flood request's service time
c = (P / PS + OF / GS) / TS (P: the flood's prompt as the simulator counts it). In arrival order the trickle waits
behind the flood (its median wait many times c): shown for contrast, not a target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import admission
from bench.admission import MODEL, PROMPT, _wait_for_counter, start_gateway, start_sim
from bench.fair_sim import (
    FLOOD_HOLD_S,
    SCENARIOS,
    Result,
    TenantResult,
    flood,
    render,
    simulate,
    summarise,
    trickle,
)
from bench.overhead import _wait_ready

ORDERS = ("fair", "arrival")
WEIGHTS = {"flood": 1.0, "a": 1.0, "b": 2.0}
TRICKLE = ("a", "b")
SHARE_TOLERANCE = 0.95
FLOOD_SIZES = (0, 50, 200)


def key_of(tenant: str) -> str:
    return f"bench-{tenant}-key"


@dataclass(frozen=True)
class Load:
    slots: int  # K, OLLAMA_NUM_PARALLEL
    flood_requests: int  # F
    flood_output_tokens: int  # OF
    trickle_requests: int  # N, per trickle tenant
    trickle_every_s: float  # E
    output_tokens: dict[str, int]  # OA, OB
    prompt_speed: float  # PS, tokens/s
    gen_speed: float  # GS, tokens/s per sequence
    time_scale: float  # TS, simulated seconds per real second
    trickle_start_s: float = 0.25  # after the flood was sent, so it is queued first

    def flood_request_s(self, prompt_tokens: int) -> float:
        """c: real seconds one flood request holds its slot."""
        return (prompt_tokens / self.prompt_speed + self.flood_output_tokens / self.gen_speed) / self.time_scale

    def sim_work(self) -> admission.Workload:
        """The simulator's settings, as bench/admission.py starts it (answers of exactly OF tokens; num_predict
        cuts the trickle's shorter)."""
        return admission.Workload(clients=0, per_client=0, slots=self.slots, output_tokens=self.flood_output_tokens,
                                  prompt_speed=self.prompt_speed, gen_speed=self.gen_speed,
                                  time_scale=self.time_scale, rounds=1)


# c = 960 / 60 / 40 = 0.4 s; the flood alone is 200 / 4 x 0.4 = 20 s; the trickle (15 s) takes about a third of the
# slots while it lasts (well below a's and b's weighted shares of a quarter and a half).
DEFAULT = Load(slots=4, flood_requests=200, flood_output_tokens=960, trickle_requests=60, trickle_every_s=0.25,
               output_tokens={"a": 128, "b": 256}, prompt_speed=4000.0, gen_speed=60.0, time_scale=40.0)
# c = 480 / 60 / 40 = 0.2 s; the flood alone is 40 / 4 x 0.2 = 2 s, the trickle 1.6 s (40 requests each, so one
# request in flight when the window closes is 2.5% of a tenant's tokens, within the tolerance; light, so kvgate's
# own per-request cost on a busy machine does not make it a backlog).
QUICK = Load(slots=4, flood_requests=40, flood_output_tokens=480, trickle_requests=40, trickle_every_s=0.04,
             output_tokens={"a": 16, "b": 32}, prompt_speed=4000.0, gen_speed=60.0, time_scale=40.0,
             trickle_start_s=0.05)


def config_toml(order: str) -> str:
    tenants = "".join(f'[tenants.{name}]\napi_keys = ["{key_of(name)}"]\nweight = {weight}\n\n'
                      for name, weight in WEIGHTS.items())
    return (f'[admission]\nqueue_order = "{order}"\nmax_queue = 4096\nqueue_timeout_s = 600.0\n\n{tenants}')


@dataclass
class Answer:
    tenant: str
    sent_s: float  # since the round began
    status: int
    wait_s: float = 0.0  # X-Kvgate-Queue-Wait
    tokens: int = 0  # prompt_eval_count + eval_count
    prompt_tokens: int = 0


@dataclass
class Run:
    order: str
    answers: list[Answer] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def failed(self) -> int:
        return sum(a.status != 200 for a in self.answers)

    def result(self) -> Result:
        """The answers as bench/fair_sim.py's Result: shares in the contended window, waits."""
        tenants = {name: TenantResult(name, weight) for name, weight in WEIGHTS.items()}
        arrivals, admissions = [], []
        for a in self.answers:
            if a.status != 200:
                continue
            tenants[a.tenant].waits_s.append(a.wait_s)
            arrivals.append((a.tenant, a.sent_s, a.tokens))
            admissions.append((a.tenant, a.sent_s + a.wait_s, a.tokens))
        return summarise(self.order, tenants, arrivals, admissions)


async def _chat(http: aiohttp.ClientSession, url: str, tenant: str, output_tokens: int, t0: float, run: Run) -> None:
    body = orjson.dumps({"model": MODEL, "stream": False, "messages": [{"role": "user", "content": PROMPT}],
                         "options": {"num_predict": output_tokens}})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key_of(tenant)}"}
    answer = Answer(tenant, time.perf_counter() - t0, 0)
    try:
        async with http.post(f"{url}/api/chat", data=body, headers=headers) as response:
            raw = await response.read()
            answer.status = response.status
            answer.wait_s = float(response.headers.get("X-Kvgate-Queue-Wait", "0"))
    except (aiohttp.ClientError, TimeoutError):
        answer.status = -1
    else:
        if answer.status == 200:
            parsed = orjson.loads(raw)
            answer.prompt_tokens = int(parsed["prompt_eval_count"])
            answer.tokens = answer.prompt_tokens + int(parsed["eval_count"])
    run.answers.append(answer)


async def run_order(http: aiohttp.ClientSession, url: str, order: str, load: Load) -> Run:
    """One round: the flood at once, the trickle at its fixed interval; returns when every answer is in."""
    run = Run(order)
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(_chat(http, url, "flood", load.flood_output_tokens, t0, run))
             for _ in range(load.flood_requests)]
    for i in range(load.trickle_requests):
        for offset, tenant in ((0.0, "a"), (0.5, "b")):
            due_s = load.trickle_start_s + (i + offset) * load.trickle_every_s
            await asyncio.sleep(max(0.0, due_s - (time.perf_counter() - t0)))
            tasks.append(asyncio.create_task(_chat(http, url, tenant, load.output_tokens[tenant], t0, run)))
    await asyncio.gather(*tasks)
    run.wall_s = time.perf_counter() - t0
    return run


@dataclass
class Measured:
    load: Load
    runs: list[Run]
    flood_prompt_tokens: int
    counters: dict[str, str]  # per order: kvgate's X-Kvgate-Counter once warm

    @property
    def flood_request_s(self) -> float:
        return self.load.flood_request_s(self.flood_prompt_tokens)

    def results(self, order: str) -> list[Result]:
        return [run.result() for run in self.runs if run.order == order]

    def median(self, order: str, tenant: str, what: str) -> float:
        values = []
        for result in self.results(order):
            t = result.tenants[tenant]
            values.append({"share": result.share(tenant), "fair_share": result.fair_share(tenant),
                           "median_wait_s": t.median_wait_s, "p90_wait_s": t.p90_wait_s}[what])
        return statistics.median(values)

    def misses(self) -> list[str]:
        """The fair-order targets missed (on the median round), each as a sentence; empty: all met."""
        missed = [f"fair order: {run.failed} requests failed"
                  for run in self.runs if run.order == "fair" and run.failed]
        for tenant in TRICKLE:
            share, fair = self.median("fair", tenant, "share"), self.median("fair", tenant, "fair_share")
            if share < SHARE_TOLERANCE * fair:
                missed.append(f"fair order: {tenant} got {share:.1%} of the served tokens, under "
                              f"{SHARE_TOLERANCE:.0%} of its fair share {fair:.1%}")
            wait_s = self.median("fair", tenant, "median_wait_s")
            if wait_s >= self.flood_request_s:
                missed.append(f"fair order: {tenant}'s median wait {wait_s:.3f} s is not below one flood request's "
                              f"service time {self.flood_request_s:.3f} s")
        return missed


async def _warm(http: aiohttp.ClientSession, sim: str, gateways: dict[str, str], load: Load) -> tuple[int, dict[str,
                                                                                                           str]]:
    await _wait_ready(f"{sim}/api/tags", 30.0)
    for url in gateways.values():
        await _wait_ready(f"{url}/kvgate/health", 30.0)
    body = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": PROMPT}],
            "options": {"num_predict": load.flood_output_tokens}}
    async with http.post(f"{sim}/api/chat", json=body) as response:  # loads the model; the flood's prompt count
        answer = await response.json()
        assert response.status == 200 and answer["eval_count"] == load.flood_output_tokens, answer
    warm_work = load.sim_work()  # kvgate probes the pool and builds the model's tokenizer
    counted = await asyncio.gather(*(_wait_for_counter(http, url, warm_work, deadline_s=30.0)
                                     for url in gateways.values()))
    return int(answer["prompt_eval_count"]), dict(zip(gateways, counted, strict=True))


async def measure(sim: str, gateways: dict[str, str], load: Load, rounds: int) -> Measured:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        prompt_tokens, counters = await _warm(http, sim, gateways, load)
        runs = []
        for _ in range(rounds):
            for order in ORDERS:
                runs.append(await run_order(http, gateways[order], order, load))
        return Measured(load, runs, prompt_tokens, counters)


def measure_processes(load: Load, rounds: int) -> Measured:
    """The simulator and one kvgate per order, each its own process on 127.0.0.1; all stopped before returning."""
    processes = []
    try:
        sim, sim_url = start_sim(load.sim_work())
        processes.append(sim)
        gateways = {}
        with tempfile.TemporaryDirectory(prefix="kvgate-fairness-") as folder:
            for order in ORDERS:
                path = Path(folder, f"{order}.toml")
                path.write_text(config_toml(order))
                gateway, gateways[order] = start_gateway(sim_url, load.slots, str(path))
                processes.append(gateway)
            return asyncio.run(measure(sim_url, gateways, load, rounds))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)


def render_measured(m: Measured) -> str:
    load, c = m.load, m.flood_request_s
    lines = [
        f"part 2: real processes on 127.0.0.1, kvgate serve in front of the simulated Ollama ({MODEL}), split pool of "
        f"K={load.slots} slots",
        f"  flood: {load.flood_requests} chats at once, num_predict {load.flood_output_tokens}; a, b: "
        f"{load.trickle_requests} chats each, one every {load.trickle_every_s:g} s, num_predict "
        f"{load.output_tokens['a']} and {load.output_tokens['b']}; weights "
        + ", ".join(f"{t} {w:g}" for t, w in WEIGHTS.items()),
        f"  one flood request holds its slot c = (P/PS + OF/GS)/TS = ({m.flood_prompt_tokens}/{load.prompt_speed:g} + "
        f"{load.flood_output_tokens}/{load.gen_speed:g})/{load.time_scale:g} = {c:.3f} s; kvgate counted with "
        + ", ".join(f"{order}: {counter or '?'}" for order, counter in m.counters.items()),
    ]
    for run in m.runs:
        lines.append(render(f"  round of {run.wall_s:.1f} s, {len(run.answers)} requests, {run.failed} failed",
                            run.result()))
    lines.append(f"  fair vs arrival (median of {len(m.runs) // len(ORDERS)} rounds):")
    lines.append(f"  {'tenant':<8} {'weight':>6} {'order':<8} {'share':>7} {'fair share':>10} {'of fair':>8} "
                 f"{'median wait':>12} {'p90 wait':>9} {'median / c':>10}")
    for tenant in WEIGHTS:
        for order in ORDERS:
            share, fair = m.median(order, tenant, "share"), m.median(order, tenant, "fair_share")
            wait_s = m.median(order, tenant, "median_wait_s")
            lines.append(f"  {tenant:<8} {WEIGHTS[tenant]:>6g} {order:<8} {share:>7.1%} {fair:>10.1%} "
                         f"{share / fair if fair else float('nan'):>8.0%} {wait_s:>10.3f} s "
                         f"{m.median(order, tenant, 'p90_wait_s'):>7.3f} s {wait_s / c:>10.2f}")
    waits = ", ".join(f"{t} {m.median('arrival', t, 'median_wait_s') / c:.1f} c" for t in TRICKLE)
    lines.append(f"  arrival order, for contrast: the trickle waits behind the flood (median wait {waits})")
    misses = m.misses()
    lines.append(f"target (fair order): every request answered; a and b >= {SHARE_TOLERANCE:.0%} of their fair share "
                 f"of the served tokens, median wait < c = {c:.3f} s -> {'FAIL' if misses else 'PASS'}")
    lines.extend(f"  missed: {miss}" for miss in misses)
    return "\n".join(lines)


def result_json(result: Result) -> dict[str, Any]:
    return {"window_s": round(result.window_s, 3), "tenants": {
        name: {"weight": t.weight, "requests": len(t.waits_s), "served_tokens": t.served_tokens,
               "asked_tokens": t.asked_tokens, "share": round(result.share(name), 4),
               "fair_share": round(result.fair_share(name), 4), "median_wait_s": round(t.median_wait_s, 4),
               "p90_wait_s": round(t.p90_wait_s, 4)}
        for name, t in result.tenants.items()}}


def measured_json(m: Measured) -> dict[str, Any]:
    load = m.load
    return {
        "load": {"slots": load.slots, "flood_requests": load.flood_requests,
                 "flood_output_tokens": load.flood_output_tokens, "trickle_requests": load.trickle_requests,
                 "trickle_every_s": load.trickle_every_s, "output_tokens": load.output_tokens,
                 "prompt_tokens_per_s": load.prompt_speed, "gen_tokens_per_s": load.gen_speed,
                 "time_scale": load.time_scale, "weights": WEIGHTS},
        "flood_prompt_tokens": m.flood_prompt_tokens,
        "flood_request_s": round(m.flood_request_s, 4),
        "kvgate_counter": m.counters,
        "rounds": [{"order": run.order, "wall_s": round(run.wall_s, 3), "requests": len(run.answers),
                    "failed": run.failed, **result_json(run.result())} for run in m.runs],
        "median": {order: {tenant: {what: round(m.median(order, tenant, what), 4)
                                    for what in ("share", "fair_share", "median_wait_s", "p90_wait_s")}
                           for tenant in WEIGHTS} for order in ORDERS},
        "target_share_of_fair": SHARE_TOLERANCE,
        "misses": m.misses(),
        "target_met": not m.misses(),
    }


@dataclass
class Virtual:
    scenarios: dict[str, dict[str, Result]]  # scenario -> order -> result
    waits_s: dict[str, dict[int, dict[str, float]]]  # order -> flood size -> tenant -> median wait


async def run_virtual(quick: bool = False) -> Virtual:
    """The scenarios (--quick: the trickle only) and the wait table, in both orders."""
    chosen = {"trickle": trickle} if quick else SCENARIOS
    scenarios = {name: {order: await simulate(flood(200) + others(), order=order) for order in ORDERS}
                 for name, others in chosen.items()}
    waits: dict[str, dict[int, dict[str, float]]] = {order: {} for order in ORDERS}
    for order in ORDERS:
        for count in FLOOD_SIZES:
            result = await simulate(flood(count) + trickle(), order=order)
            waits[order][count] = {t: result.tenants[t].median_wait_s for t in TRICKLE}
    return Virtual(scenarios, waits)


def render_virtual(v: Virtual) -> str:
    lines = ["part 1: virtual time, kvgate's waiting room on a 32,768-token unified pool (bench/fair_sim.py); the "
             f"flood: 8,000-token requests held {FLOOD_HOLD_S:g} s each"]
    for name, by_order in v.scenarios.items():
        lines.extend(render(f"{name}: 200-request flood", result) for result in by_order.values())
    lines.append("median wait of the trickle against the size of the flood:")
    lines.append(f"  {'order':<8} " + " ".join(f"{f'flood {n}: a':>12} {'b':>7}" for n in FLOOD_SIZES))
    for order, by_count in v.waits_s.items():
        lines.append(f"  {order:<8} " + " ".join(f"{by_count[n]['a']:>10.2f} s {by_count[n]['b']:>5.2f} s"
                                                 for n in FLOOD_SIZES))
    return "\n".join(lines)


def virtual_json(v: Virtual) -> dict[str, Any]:
    return {"scenarios": {name: {order: result_json(r) for order, r in by_order.items()}
                          for name, by_order in v.scenarios.items()},
            "median_wait_s_by_flood": {order: {str(n): w for n, w in by_count.items()}
                                       for order, by_count in v.waits_s.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: the trickle scenario only; a 40-request flood, 2-3 s an order")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of each order, alternating (default 1)")
    parser.add_argument("--virtual-only", action="store_true", help="part 1 only (no processes, no sockets)")
    args = parser.parse_args(argv)
    virtual = asyncio.run(run_virtual(args.quick))
    report: dict[str, Any] = {"virtual": virtual_json(virtual)}
    if not args.json:
        print(render_virtual(virtual), flush=True)
    code = 0
    if not args.virtual_only:
        measured = measure_processes(QUICK if args.quick else DEFAULT, max(1, args.rounds))
        report["real"] = measured_json(measured)
        code = 1 if measured.misses() else 0
        if not args.json:
            print()
            print(render_measured(measured))
    if args.json:
        print(json.dumps(report, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
