"""PoolDirectory against a fake set of backend probes and a fake clock: probes are shared, retried until
``probe_wait_s`` then refused, a known layout outlives a failed refresh, and stale marks force a re-read."""

from __future__ import annotations

import asyncio
import collections
from typing import Any, cast

import pytest

from gateway.admission import PoolSpec
from gateway.admission.kv_pools import REFRESH_AHEAD_AT, PoolDirectory
from gateway.backends import Backend
from gateway.backends.client import BackendClient
from gateway.backends.prober import ProbeError
from gateway.backends.probes import BackendProbes
from gateway.config.settings import Settings, load_settings
from gateway.domain import BackendKind
from gateway.errors import BackendNotReady
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.llama_server_answers import ServerProps
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.runtimes import runtime_for
from tests.support.clock import FakeClock

MODEL = "llama3.1:8b"
PROBE_WAIT_S = 3.0
REFRESH_S = 30.0


class FakeProbes:
    """Stands in for gateway.backends.probes.BackendProbes: answers from fields the test sets, counts calls, fails
    the next ``failures`` calls, and holds each answer until ``gate`` opens (when set)."""

    def __init__(self) -> None:
        self.n_ctx_slot = 4096
        self.contexts: dict[str, int | None] = {MODEL: 8192}
        self.load_context = 2048
        """What a load request (load_model) loads a model with."""
        self.failures = 0
        self.gate: asyncio.Event | None = None
        self.calls: collections.Counter[str] = collections.Counter()

    async def _answer(self, name: str) -> None:
        self.calls[name] += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise ProbeError(f"GET /{name} failed: connection refused")

    async def llama_props(self, backend: Backend) -> ServerProps:
        await self._answer("props")
        return ServerProps(n_ctx_slot=self.n_ctx_slot, total_slots=4, model_path="/models/served.gguf",
                           model_alias="", build_info="b1", is_sleeping=False)

    async def loaded_model(self, backend: Backend, model: str, *, join_running: bool = True) -> LoadedModel | None:
        await self._answer("ps")
        context = self.contexts.get(model)
        return None if context is None else LoadedModel(model, "", 0, 0, context, None, None)

    async def profile(self, backend: Backend, model: str) -> ModelProfile:
        raise LookupError("no profile in this test: one slot, assumed")

    async def ollama_version(self, backend: Backend) -> str | None:
        return "0.30.0"

    async def load_model(self, backend: Backend, model: str, num_ctx: int | None) -> None:
        await self._answer("generate")
        self.contexts[model] = num_ctx or self.load_context

    async def loaded_models(self, backend: Backend) -> list[Any]:
        await self._answer("ps")
        return []


def setup(kind: str = "llama-server", **admission: Any) -> tuple[PoolDirectory, Backend, FakeProbes, FakeClock]:
    settings: Settings = load_settings(
        None, backends=[{"name": "gpu0", "kind": kind, "url": "http://127.0.0.1:9"}],
        admission={"probe_wait_s": PROBE_WAIT_S, "pool_refresh_s": REFRESH_S, **admission},
    )
    probes, clock = FakeProbes(), FakeClock()
    pools = PoolDirectory(settings, cast(BackendProbes, probes), clock=clock, sleep=clock.sleep)
    config = settings.backends[0]
    return pools, Backend(config, cast(BackendClient, None), runtime=runtime_for(config.kind)), probes, clock


async def test_llama_server_layout_from_props_unified_by_default() -> None:
    pools, backend, _, _ = setup()
    pool = await pools.pool_for(backend, "whatever the request says")
    assert pool == PoolSpec.unified_pool("gpu0", "served.gguf", pool_tokens=4096, slots=4)
    assert pools.known() == {pool.key: pool}


async def test_concurrent_requests_share_one_probe() -> None:
    pools, backend, probes, _ = setup()
    probes.gate = asyncio.Event()
    waiting = [asyncio.create_task(pools.pool_for(backend, None)) for _ in range(20)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert probes.calls["props"] == 1 and not any(task.done() for task in waiting)
    probes.gate.set()
    layouts = await asyncio.gather(*waiting)
    assert len({id(pool) for pool in layouts}) == 1
    assert (pools.probes, probes.calls["props"]) == (1, 1)


async def test_a_cancelled_request_does_not_cancel_the_shared_probe() -> None:
    pools, backend, probes, _ = setup()
    probes.gate = asyncio.Event()
    first, second = (asyncio.create_task(pools.pool_for(backend, None)) for _ in range(2))
    await asyncio.sleep(0)
    first.cancel()
    probes.gate.set()
    pool = await second
    assert pool is not None and pool.slot_ctx_tokens == 4096
    assert probes.calls["props"] == 1


async def test_a_cached_layout_is_reused_until_the_refresh_period() -> None:
    pools, backend, probes, clock = setup()
    first = await pools.pool_for(backend, None)
    clock.advance(REFRESH_S * REFRESH_AHEAD_AT - 1)
    assert await pools.pool_for(backend, None) is first
    await asyncio.sleep(0)
    assert probes.calls["props"] == 1  # before the read-ahead share of the period: not even a read beside
    clock.advance(REFRESH_S)  # no request in the read-ahead window: the next one waits for the probe, as always
    probes.n_ctx_slot, probes.gate = 8192, asyncio.Event()
    waiting = asyncio.ensure_future(pools.pool_for(backend, None))
    await _ticks()
    assert not waiting.done() and probes.calls["props"] == 2
    probes.gate.set()
    refreshed = await waiting
    assert refreshed is not None and refreshed.slot_ctx_tokens == 8192


async def _ticks(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_layout_is_read_again_ahead_so_steady_traffic_never_waits_for_a_refresh() -> None:
    pools, backend, probes, clock = setup()
    first = await pools.pool_for(backend, None)
    clock.advance(REFRESH_S * REFRESH_AHEAD_AT)
    probes.n_ctx_slot, probes.gate = 8192, asyncio.Event()  # the re-read is held: the requests must not be
    served = [await asyncio.wait_for(pools.pool_for(backend, None), 1.0) for _ in range(3)]
    await _ticks()
    assert served == [first] * 3 and probes.calls["props"] == 1 + 1  # one read beside them, not three
    probes.gate.set()
    await _ticks()
    clock.advance(REFRESH_S * (1 - REFRESH_AHEAD_AT) + 1)  # past the first read's period, within the re-read's
    after = await pools.pool_for(backend, None)
    assert after is not None and after.slot_ctx_tokens == 8192 and probes.calls["props"] == 2
    assert clock.sleeps == []


async def test_a_request_past_the_period_joins_the_read_ahead_that_runs() -> None:
    pools, backend, probes, clock = setup()
    await pools.pool_for(backend, None)
    clock.advance(REFRESH_S * REFRESH_AHEAD_AT)
    probes.n_ctx_slot, probes.gate = 8192, asyncio.Event()
    await pools.pool_for(backend, None)  # starts the read-ahead
    clock.advance(REFRESH_S)  # the read-ahead is slow: the next request finds the layout past its period
    waiting = asyncio.ensure_future(pools.pool_for(backend, None))
    await _ticks()
    assert not waiting.done() and probes.calls["props"] == 2  # it waits for that read, and starts none
    probes.gate.set()
    joined = await waiting
    assert joined is not None and joined.slot_ctx_tokens == 8192 and probes.calls["props"] == 2


async def test_a_read_ahead_loads_nothing_and_fails_quietly_then_the_next_request_probes_as_before() -> None:
    pools, backend, probes, clock = setup("ollama")
    first = await pools.pool_for(backend, MODEL)
    for unreadable in ("unloaded", "refused"):
        clock.advance(REFRESH_S * REFRESH_AHEAD_AT)
        if unreadable == "unloaded":
            probes.contexts.pop(MODEL)  # Ollama unloaded it (keep_alive): a read-ahead must not load it
        else:
            probes.failures = 1
        loads = probes.calls["generate"]
        assert await pools.pool_for(backend, MODEL) is first
        await _ticks()
        assert probes.calls["generate"] == loads and clock.sleeps == []  # nothing loaded, no retries
        clock.advance(REFRESH_S * (1 - REFRESH_AHEAD_AT))  # past the period: this request probes (and loads)
        again = await pools.pool_for(backend, MODEL)
        assert first is not None and again is not None
        print(f"{unreadable}: the read-ahead left {first.slot_ctx_tokens:,}; the next request read "
              f"{again.slot_ctx_tokens:,} (loads: {probes.calls['generate']})")
        first = again
    assert probes.calls["generate"] == 1 and first is not None and first.slot_ctx_tokens == probes.load_context


async def test_a_read_ahead_answer_older_than_a_stale_mark_is_dropped() -> None:
    pools, backend, probes, clock = setup("ollama")
    await pools.pool_for(backend, MODEL)
    clock.advance(REFRESH_S * REFRESH_AHEAD_AT)
    probes.gate = asyncio.Event()
    await pools.pool_for(backend, MODEL)  # the read-ahead starts and reads the old context
    await _ticks()
    pools.mark_stale(backend, MODEL)  # a response reloaded the model meanwhile
    probes.contexts[MODEL] = 16384
    probes.gate.set()
    reread = await pools.pool_for(backend, MODEL)
    assert reread is not None and reread.slot_ctx_tokens == 16384 and probes.calls["ps"] == 3


async def test_closing_ends_a_read_ahead_that_runs() -> None:
    pools, backend, probes, clock = setup()
    await pools.pool_for(backend, None)
    clock.advance(REFRESH_S * REFRESH_AHEAD_AT)
    probes.gate = asyncio.Event()
    await pools.pool_for(backend, None)
    await _ticks()
    assert probes.calls["props"] == 2
    await asyncio.wait_for(pools.aclose(), 1.0)


async def test_probes_are_retried_then_refused_after_probe_wait_s() -> None:
    pools, backend, probes, clock = setup()
    probes.failures = 1_000
    started_s = clock()
    with pytest.raises(BackendNotReady) as refused:
        await pools.pool_for(backend, None)
    assert probes.calls["props"] >= 2  # retried, with pauses that grow
    assert clock.sleeps == sorted(clock.sleeps) and sum(clock.sleeps) <= PROBE_WAIT_S
    assert clock() - started_s <= PROBE_WAIT_S
    message = str(refused.value)
    assert "backend 'gpu0'" in message and "probe_wait_s" in message and "connection refused" in message
    assert (refused.value.retry_after_s or 0) > 0
    assert pools.known() == {}


async def test_a_probe_that_succeeds_on_a_retry_admits() -> None:
    pools, backend, probes, clock = setup()
    probes.failures = 2
    pool = await pools.pool_for(backend, None)
    assert pool is not None and pool.slot_ctx_tokens == 4096
    assert probes.calls["props"] == 3 and len(clock.sleeps) == 2


async def test_a_known_layout_stands_while_a_refresh_fails() -> None:
    pools, backend, probes, clock = setup()
    known = await pools.pool_for(backend, None)
    clock.advance(REFRESH_S)
    probes.failures = 1_000
    assert await pools.pool_for(backend, None) is known
    assert clock.sleeps == []  # no retry wait: the request goes on with the last layout
    probes.failures = 0
    clock.advance(REFRESH_S)
    probes.n_ctx_slot = 2048
    recovered = await pools.pool_for(backend, None)
    assert recovered is not None and recovered.slot_ctx_tokens == 2048


async def test_mark_stale_forces_the_next_request_to_re_read() -> None:
    pools, backend, probes, _ = setup("ollama")
    first = await pools.pool_for(backend, MODEL)
    assert first is not None and first.slot_ctx_tokens == 8192
    await pools.pool_for(backend, MODEL)
    assert probes.calls["ps"] == 1
    probes.contexts[MODEL] = 16384  # reloaded by a response at another num_ctx
    pools.mark_stale(backend, MODEL)
    reread = await pools.pool_for(backend, MODEL)
    assert probes.calls["ps"] == 2 and reread is not None and reread.slot_ctx_tokens == 16384
    await pools.pool_for(backend, MODEL)
    assert probes.calls["ps"] == 2  # one re-read per mark


async def test_after_default_load_re_reads_until_the_default_is_confirmed() -> None:
    pools, backend, probes, _ = setup("ollama")
    await pools.pool_for(backend, MODEL)
    pools.after_default_load(backend, MODEL)
    probes.contexts[MODEL] = 4096  # the /v1 request reloaded the model at Ollama's default context
    changed = await pools.pool_for(backend, MODEL)
    assert changed is not None and changed.slot_ctx_tokens == 4096 and probes.calls["ps"] == 2
    pools.after_default_load(backend, MODEL)  # the layout changed: not confirmed yet, read once more
    await pools.pool_for(backend, MODEL)
    assert probes.calls["ps"] == 3
    pools.after_default_load(backend, MODEL)  # the re-read showed the same context: confirmed
    await pools.pool_for(backend, MODEL)
    assert probes.calls["ps"] == 3  # /v1 requests cost no extra probe from now on


async def test_an_ollama_model_not_loaded_is_loaded_then_read_back() -> None:
    pools, backend, probes, _ = setup("ollama")
    probes.contexts = {}
    pool = await pools.pool_for(backend, MODEL)
    assert pool == PoolSpec.split_pool("gpu0", MODEL, BackendKind.OLLAMA, slot_ctx_tokens=2048, slots=1)
    assert (probes.calls["generate"], probes.calls["ps"]) == (1, 2)
