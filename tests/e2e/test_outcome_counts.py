"""Issue 22, point 6: every outcome is counted apart, once, and the status JSON, the metrics and the tenant usage agree.

One kvgate in front of two simulators: an Ollama (llama3.1:8b and the summary model phi3:mini, 2,048-token context,
one slot) and a llama-server (qwen2.5:7b, one slot of 4,096 tokens, slow enough that an answer can be held open),
and a fake Ollama serving "slow:1b", a summary model that takes 30 s to answer.
Each case runs as its own tenant, and the test reads /kvgate/status, /kvgate/metrics and /kvgate/tenants before and
after it: the change in each must be the case's outcome, and the three must agree. A chat that was trimmed (or
summarized) and answered 200 is no refusal anywhere; one refused after a failed summary is one refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvsim.config import SimConfig
from kvsim.runner import start_sim
from tests.support.fake_backend import FakeLLM, Script, running
from tests.support.gateway_server import running_gateway
from tests.support.poll import until

CONTEXT_TOKENS = 2048
OLLAMA_MODEL, SUMMARY_MODEL, CPP_MODEL = "llama3.1:8b", "phi3:mini", "qwen2.5:7b"
OL_POOL, CPP_POOL = ("ol", OLLAMA_MODEL), ("cpp", CPP_MODEL)
_SENTENCE = "the plan for the release needs a date a budget and a team of four people who know the code"
_WORDS = tuple(_SENTENCE.split(" "))
SUMMARY = {"remedies": ["summarize", "trim"], "summary_model": SUMMARY_MODEL, "summary_max_tokens": 64}
MISSING = "no-such-model:1b"
TENANTS: dict[str, dict[str, Any]] = {
    "forwarded": {}, "clamped": {}, "pinned": {}, "trimmed": {},
    "summarized": {"fitting": SUMMARY},
    "summary_trim": {"fitting": {**SUMMARY, "summary_model": MISSING}},
    "summary_too_long": {"fitting": SUMMARY},
    "summary_timeout": {"fitting": {**SUMMARY, "summary_model": "slow:1b", "summary_timeout_s": 0.3}},
    "summary_refuse": {"fitting": {**SUMMARY, "summary_model": MISSING, "remedies": ["summarize", "refuse"]}},
    "strict": {"fitting": {"strict": True}},
    "holder": {}, "timeout": {}, "queued": {}, "full": {},
}
for _name, _tenant in TENANTS.items():
    _tenant["api_keys"] = [f"{_name}-key-0123456789"]


def words(n: int, seed: int) -> str:
    return " ".join(_WORDS[(seed + i) % len(_WORDS)] for i in range(n))


LONG_CHAT = [{"role": "user" if i % 2 == 0 else "assistant", "content": words(220, i)} for i in range(13)]
SUMMED_CHAT = [*({"role": "user" if i % 2 == 0 else "assistant", "content": words(150, i)} for i in range(6)),
               {"role": "user", "content": words(1300, 6)}]
"""Too long for the context; its oldest two turns (what a summary replaces) fit the summary model's own context."""


@contextlib.asynccontextmanager
async def simulators() -> AsyncIterator[tuple[str, str, str]]:
    from tests.tokens.vocab_vectors import warm_sim_tokenizers

    cache = warm_sim_tokenizers(OLLAMA_MODEL, SUMMARY_MODEL, CPP_MODEL)
    ollama = SimConfig(models=(OLLAMA_MODEL, SUMMARY_MODEL), load_s=0.01, time_scale=50.0,
                       context_length=CONTEXT_TOKENS, min_response_tokens=8, max_response_tokens=24,
                       gen_tokens_per_s=2000.0,
                       prompt_tokens_per_s=500_000.0, tokenizer_cache_dir=cache)
    cpp = SimConfig(mode="llama-server", server_model=CPP_MODEL, ctx_size=4096, n_parallel=1, gen_tokens_per_s=20.0,
                    min_response_tokens=4, max_response_tokens=8, tokenizer_cache_dir=cache)
    ol_runner, ol_url = await start_sim(ollama)
    cpp_runner, cpp_url = await start_sim(cpp)
    try:
        async with running(FakeLLM(Script(models=("slow:1b",), first_byte_delay_s=30.0))) as slow:
            yield ol_url, cpp_url, slow.url
    finally:
        await ol_runner.cleanup()
        await cpp_runner.cleanup()


@dataclass
class Reading:
    """Everything kvgate says it counted, at one moment."""

    pools: dict[tuple[str, str], Counter[str]]  # per pool: decisions and "refused:<reason>"
    totals: Counter[str]  # the status's outcomes of every request
    metrics: Counter[str]  # decisions (summed over backends), "refused:<reason>" per pool, queue rejections
    tenants: dict[str, Counter[str]]  # per tenant: requests by status class, "refused:<reason>"
    summary_failures: Counter[str] = field(default_factory=Counter)

    def minus(self, before: Reading) -> Reading:
        def sub(a: Counter[str], b: Counter[str]) -> Counter[str]:
            return Counter({k: a[k] - b[k] for k in {*a, *b} if a[k] != b[k]})
        return Reading({k: sub(self.pools.get(k, Counter()), before.pools.get(k, Counter()))
                        for k in {*self.pools, *before.pools}},
                       sub(self.totals, before.totals), sub(self.metrics, before.metrics),
                       {k: sub(self.tenants.get(k, Counter()), before.tenants.get(k, Counter()))
                        for k in {*self.tenants, *before.tenants}},
                       sub(self.summary_failures, before.summary_failures))


def _outcome_counter(row: dict[str, Any]) -> Counter[str]:
    found: Counter[str] = Counter({key.removesuffix("_total"): value for key, value in row.items()
                                   if key.endswith("_total") and isinstance(value, int) and value})
    found.update({f"refused:{reason}": n for reason, n in row["refused"].items()})
    return found


async def read(http: aiohttp.ClientSession, url: str) -> Reading:
    async with http.get(f"{url}/kvgate/status") as reply:
        status = await reply.json()
    async with http.get(f"{url}/kvgate/metrics") as reply:
        text = await reply.text()
    async with http.get(f"{url}/kvgate/tenants") as reply:
        tenants = (await reply.json())["tenants"]
    pools = {(p["backend"], p["model"]): _outcome_counter(p) for p in status["pools"]}
    metrics: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "kvgate_decisions_total":
                metrics[labels["decision"]] += int(sample.value)
            elif sample.name == "kvgate_pool_refusals_total":
                metrics[f"pool:{labels['backend']}/{labels['model']}:refused:{labels['reason']}"] += int(sample.value)
            elif sample.name == "kvgate_queue_rejected_total":
                metrics[f"queue_rejected:{labels['reason']}"] += int(sample.value)
            elif sample.name == "kvgate_tenant_refusals_total":
                metrics[f"tenant:{labels['tenant']}:refused:{labels['reason']}"] += int(sample.value)
            elif sample.name == "kvgate_summary_failures_total":
                failures[labels["reason"]] += int(sample.value)
    usage = {name: Counter({**{f"requests:{c}": n for c, n in row["requests"].items()},
                            **{f"refused:{r}": n for r, n in row["refusals"].items()}})
             for name, row in tenants.items()}
    return Reading(pools, _outcome_counter(status["outcomes"]), metrics, usage, failures)


@dataclass(frozen=True)
class Case:
    name: str
    pool: tuple[str, str]
    expect: dict[str, int]  # the pool's decisions and "refused:<reason>"
    status: int
    summary_failure: str | None = None


CASES = [
    Case("forwarded", OL_POOL, {"admitted": 1}, 200),
    Case("clamped", OL_POOL, {"admitted": 1, "rewritten": 1, "clamped": 1}, 200),
    Case("pinned", OL_POOL, {"admitted": 1, "rewritten": 1, "pinned": 1}, 200),
    Case("trimmed", OL_POOL, {"admitted": 1, "trimmed": 1}, 200),
    Case("summarized", OL_POOL, {"admitted": 1, "summarized": 1}, 200),
    Case("summary_trim", OL_POOL, {"admitted": 1, "trimmed": 1, "summary_failed": 1}, 200, "error"),
    Case("summary_too_long", OL_POOL, {"admitted": 1, "trimmed": 1, "summary_failed": 1}, 200, "too_long"),
    Case("summary_timeout", OL_POOL, {"admitted": 1, "trimmed": 1, "summary_failed": 1}, 200, "timeout"),
    Case("summary_refuse", OL_POOL, {"refused": 1, "summary_failed": 1, "refused:context_length_exceeded": 1}, 400,
         "error"),
    Case("strict", OL_POOL, {"refused": 1, "refused:context_length_exceeded": 1}, 400),
    Case("timeout", CPP_POOL, {"refused": 1, "refused:queue_timeout": 1}, 503),
    Case("full", CPP_POOL, {"refused": 1, "refused:queue_full": 1}, 503),
    Case("queued", CPP_POOL, {"admitted": 2, "queued": 1}, 200),  # and the holder it waited for, once it ended
]
QUEUE_LABELS = {"queue_full": "queue_full", "queue_timeout": "queue_timeout", "context_length_exceeded": "context"}


def chat(tenant: str, model: str, messages: list[dict[str, Any]], **fields: Any) -> tuple[str, dict[str, Any]]:
    return tenant, {"model": model, "stream": False, "messages": messages, **fields}


def hi() -> list[dict[str, str]]:
    return [{"role": "user", "content": "hi there"}]


BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "forwarded": ("/v1/chat/completions", {"model": OLLAMA_MODEL, "max_tokens": 16, "messages": hi()}),
    "clamped": ("/v1/chat/completions", {"model": OLLAMA_MODEL, "max_tokens": 100_000, "messages": hi()}),
    "pinned": ("/api/chat", {"model": OLLAMA_MODEL, "stream": False, "messages": hi(),
                             "options": {"num_ctx": 16384, "num_predict": 16}}),
    **{name: ("/v1/chat/completions", {"model": OLLAMA_MODEL, "max_tokens": 16, "messages": LONG_CHAT})
       for name in ("trimmed", "summary_trim", "summary_too_long", "summary_timeout", "summary_refuse", "strict")},
    "summarized": ("/v1/chat/completions", {"model": OLLAMA_MODEL, "max_tokens": 16, "messages": SUMMED_CHAT}),
}


async def test_every_outcome_is_counted_apart_and_status_metrics_and_tenants_agree() -> None:
    backends: list[dict[str, Any]] = [
        {"name": "ol", "kind": "ollama", "url": "", "context_tokens": CONTEXT_TOKENS, "parallel": 1},
        {"name": "cpp", "kind": "llama-server", "url": ""}]
    rows: list[tuple[str, int, str, str, str]] = []
    async with simulators() as (ol, cpp, slow):
        backends[0]["url"], backends[1]["url"] = ol, cpp
        backends.append({"name": "slow", "kind": "ollama", "url": slow})
        async with running_gateway(backends, tenants=TENANTS, admission={"max_queue": 1}) as url, \
                aiohttp.ClientSession() as http:
            async def post(tenant: str, path: str, body: dict[str, Any], **headers: str) -> int:
                async with http.post(url + path, json=body, headers={
                        "Authorization": f"Bearer {tenant}-key-0123456789", **headers}) as reply:
                    await reply.read()
                    return reply.status

            async def queued() -> bool:
                async with http.get(f"{url}/kvgate/status") as reply:
                    return any(p["queued"] for p in (await reply.json())["pools"])

            await post("forwarded", "/api/chat", {"model": OLLAMA_MODEL, "stream": False, "messages": hi(),
                                                  "options": {"num_predict": 4}})  # loads the model; not counted
            holder: asyncio.Future[int] | None = None
            waiter: asyncio.Future[int] | None = None

            async def run(case: Case) -> int:
                nonlocal holder, waiter
                if case.name in BODIES:
                    path, body = BODIES[case.name]
                    return await post(case.name, path, body)
                small = {"model": CPP_MODEL, "max_tokens": 16, "messages": hi()}
                if case.name == "timeout":  # the one slot is held by an answer that does not end by itself
                    holder = asyncio.ensure_future(post("holder", "/v1/chat/completions", {
                        **small, "max_tokens": 3000, "ignore_eos": True, "stream": True}))
                    await until(lambda: _busy(http, cpp))
                    return await post("timeout", "/v1/chat/completions", small, **{"X-Kvgate-Deadline": "0.3"})
                if case.name == "full":
                    waiter = asyncio.ensure_future(post("queued", "/v1/chat/completions", small))
                    await until(queued)
                    return await post("full", "/v1/chat/completions", small)
                assert holder is not None and waiter is not None
                holder.cancel()  # the holder's client leaves: the waiter gets the slot
                with contextlib.suppress(asyncio.CancelledError):
                    await holder
                status = await waiter
                await until(lambda: _idle(http, cpp))
                return status

            for case in CASES:
                before = await read(http, url)
                status = await run(case)
                after = await until(functools.partial(_settled, http, url, before, case))
                assert after is not None
                delta = after.minus(before)
                rows.append((case.name, status, _show(delta.pools.get(case.pool, Counter())),
                             _show(delta.totals), _show(delta.summary_failures)))
                assert status == case.status, case
                _check(case, delta)
    print("\nstatus JSON, kvgate_decisions_total, kvgate_pool_refusals_total, kvgate_queue_rejected_total and the "
          "tenants' refusals agree on every row")
    print(f"{'case':17} {'status':>6}  {'the pool counted':62} {'summary failures'}")
    for name, status, pool, _, failures in rows:
        print(f"{name:17} {status:6d}  {pool:62} {failures}")


def _show(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {v:+d}" for k, v in sorted(counts.items()) if v) or "-"


async def _busy(http: aiohttp.ClientSession, cpp: str) -> bool:
    async with http.get(f"{cpp}/slots") as reply:
        return any(slot["is_processing"] for slot in await reply.json())


async def _idle(http: aiohttp.ClientSession, cpp: str) -> bool:
    return not await _busy(http, cpp)


async def _settled(http: aiohttp.ClientSession, url: str, before: Reading, case: Case) -> Reading | None:
    """The reading once the case's requests are all counted (a request is counted when its handler ends) and nothing
    moves any more (a summary request given up on ends after the request that asked for it)."""
    after = await read(http, url)
    pool = after.minus(before).pools.get(case.pool, Counter())
    ends = ("admitted", "refused")
    counted = sum(pool[k] for k in ends) >= sum(case.expect.get(k, 0) for k in ends)
    return after if counted and await read(http, url) == after else None


def _check(case: Case, delta: Reading) -> None:
    """The case's pool counted exactly its outcome; every other view agrees with the status."""
    pool = delta.pools.get(case.pool, Counter())
    assert pool == Counter(case.expect), (case.name, pool)
    ours = {k: v for k, v in delta.totals.items() if not k.startswith("refused:")}
    decisions = {k: v for k, v in delta.metrics.items() if ":" not in k}
    assert decisions == ours, (case.name, decisions, ours)  # kvgate_decisions_total == status outcomes
    for reason in {k.split(":", 1)[1] for k in delta.totals if k.startswith("refused:")} | set(QUEUE_LABELS):
        status_n = sum(c[f"refused:{reason}"] for c in delta.pools.values())
        tenant_n = sum(c[f"refused:{reason}"] for c in delta.tenants.values())
        metric_n = sum(v for k, v in delta.metrics.items() if k.startswith("pool:") and k.endswith(f":{reason}"))
        tenant_metric_n = sum(v for k, v in delta.metrics.items() if k.startswith("tenant:")
                              and k.endswith(f":{reason}"))
        assert status_n == tenant_n == metric_n == tenant_metric_n == delta.totals[f"refused:{reason}"], (
            case.name, reason)
        if reason in QUEUE_LABELS:
            assert delta.metrics[f"queue_rejected:{QUEUE_LABELS[reason]}"] == status_n, (case.name, reason)
    if case.summary_failure is not None:
        assert delta.summary_failures == Counter({case.summary_failure: 1}), case.name
    else:
        assert not delta.summary_failures, case.name
    own = delta.tenants.get(case.name, Counter())
    assert sum(v for k, v in own.items() if k.startswith("refused:")) == case.expect.get("refused", 0), case.name

