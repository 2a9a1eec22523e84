"""Ollama's scheduler (``server/sched.go``), on virtual GPUs: load, reuse, reload, evict, expire.

Theory of operation
-------------------
``acquire`` hands a request a loaded runner directly when one exists and its load-time options match
(``options.needs_reload``); otherwise the request joins the pending queue (``OLLAMA_MAX_QUEUE`` deep, 503 when
full), which one task drains serially, exactly one request at a time::

    runner loaded?  -- matches --> use it
        | needs reload          --> expire it (in-flight requests finish first), wait for the unload, retry
    OLLAMA_MAX_LOADED_MODELS reached --> expire the idle runner with the shortest keep_alive, wait, retry
    otherwise load:
        first model            -> no pre-check; E3: llama.cpp's fit keeps on the GPU the layers that fit
                                  (free - 1 GiB - compute - output), the rest in system RAM (partial offload)
        other models resident  -> E3: predicted + batch surcharge > 80% of free?  evict one, retry
                                  E2: Ollama's estimate > free?                     evict one, retry
        allocation fails (OOM) -> automatic num_ctx: retry once a tier lower (32768, 4096)
                                  other models resident: evict them all, retry once
                                  else: 500 with the runtime's out-of-memory text

A load takes ``load_s``; the runner is visible (and usable, its requests wait) meanwhile. If the request that
triggered the load goes away first, the load is aborted (Ollama E3 does this too). A runner whose GPU becomes
oversubscribed crashes at its next decode step (``crash``): its requests fail, its memory is freed, and every
loaded runner is expired (``expireRunnersForRuntimeOOM``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from kvsim.catalog import ModelSpec
from kvsim.clock import Clock
from kvsim.config import SimConfig
from kvsim.failures import QUEUE_FULL, SimError, load_aborted, load_oom
from kvsim.gpu.kv_cache import AttentionLayers, ollama_cells
from kvsim.gpu.load_cost import buffers
from kvsim.gpu.vgpu import VirtualGpu
from kvsim.ollama.load_plan import LoadPlan, plan_load
from kvsim.ollama.loaded import LoadedRunner
from kvsim.ollama.options import LoadedState, Options, needs_reload
from kvsim.stats import SimStats

FOREVER_THRESHOLD_S = 10**9
log = logging.getLogger(__name__)


class _Outcome(Enum):
    DONE = "done"
    EVICT = "evict"  # evict one runner and try again
    RETRY = "retry"  # try again at once (OOM retry)


@dataclass(eq=False)
class _Pending:
    spec: ModelSpec
    opts: Options
    keep_alive_s: float | None
    shift: bool
    future: asyncio.Future[LoadedRunner]
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    oom_retry: bool = False


class OllamaScheduler:
    def __init__(self, config: SimConfig, vgpu: VirtualGpu, clock: Clock, stats: SimStats) -> None:
        self.config, self.vgpu, self.clock, self.stats = config, vgpu, clock, stats
        self.loaded: dict[str, LoadedRunner] = {}
        self._pending: asyncio.Queue[_Pending] = asyncio.Queue()
        self._reloading: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._worker = asyncio.create_task(self._drain_pending())

    async def close(self) -> None:
        for task in [*self._tasks, *([self._worker] if self._worker else [])]:
            task.cancel()
        for task in [*self._tasks, *([self._worker] if self._worker else [])]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in list(self.loaded.values()):
            self._unload(runner, "shutdown")

    # ---- requests -------------------------------------------------------------------------------------

    async def acquire(self, spec: ModelSpec, opts: Options, keep_alive_s: float | None, shift: bool) -> LoadedRunner:
        """A ready runner for the request, with ``ref_count`` taken (give it back with ``release``)."""
        runner = self.loaded.get(spec.name)
        pending: _Pending | None = None
        if runner is not None and not self._needs_reload(runner, opts, shift):
            self._use(runner, keep_alive_s)
        else:
            if self._pending.qsize() >= self.config.max_queue:
                raise SimError(503, QUEUE_FULL)
            pending = _Pending(spec, opts, keep_alive_s, shift, asyncio.get_running_loop().create_future())
            self._pending.put_nowait(pending)
            self.stats.queued = self._pending.qsize()
            try:
                runner = await pending.future
            except asyncio.CancelledError:
                pending.gone.set()
                handed = pending.future
                if handed.done() and not handed.cancelled() and handed.exception() is None:
                    self.release(handed.result())  # handed over just as the client left
                raise
        try:
            await runner.ready.wait()
        except asyncio.CancelledError:
            if pending is not None:
                pending.gone.set()
            self.release(runner)
            raise
        if runner.error is not None:
            self.release(runner)
            raise runner.error
        return runner

    def release(self, runner: LoadedRunner) -> None:
        runner.ref_count -= 1
        if runner.ref_count > 0 or runner.unloaded:
            return
        if runner.session_s <= 0 or not runner.usable:
            self._unload(runner, "expired")
        elif runner.session_s < FOREVER_THRESHOLD_S:
            runner.expires_at = self._at(runner.session_s)
            runner.cancel_timer()
            runner.timer = self._spawn(self._keep_alive(runner))
        else:
            runner.expires_at = self._at(runner.session_s)

    def expire_model(self, name: str) -> None:
        """``expireRunner``: the explicit unload (``keep_alive: 0`` with no prompt)."""
        runner = self.loaded.get(name)
        if runner is not None:
            runner.expires_at = self.clock.wall()
            self._expire(runner, "unload requested")

    def crash(self, runner: LoadedRunner) -> None:
        """The runner's process died of a runtime OOM: free its memory, expire every runner."""
        if runner.crashed:
            return
        runner.crashed = True
        self.vgpu.kill(runner.pid)
        self.stats.runtime_ooms += 1
        self.stats.event(self.clock.now(), "runtime_oom", model=runner.spec.name, pid=runner.pid)
        for other in list(self.loaded.values()):
            self._expire(other, "runtime OOM")

    # ---- the pending queue ----------------------------------------------------------------------------

    async def _drain_pending(self) -> None:
        while True:
            pending = await self._pending.get()
            self.stats.queued = self._pending.qsize()
            if pending.gone.is_set() or pending.future.done():
                continue
            self.stats.scheduling += 1
            try:
                await self._schedule(pending)
            except SimError as exc:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            except Exception as exc:  # a bug: fail this request, keep serving the others
                log.exception("simulator scheduler failed on %s", pending.spec.name)
                if not pending.future.done():
                    pending.future.set_exception(SimError(500, f"simulator scheduler error: {exc}"))
            finally:
                self.stats.scheduling -= 1

    async def _schedule(self, pending: _Pending) -> None:
        while not (pending.gone.is_set() or pending.future.done()):
            runner = self.loaded.get(pending.spec.name)
            victim: LoadedRunner | None = None
            reason = "evicted"
            if runner is not None:
                if not self._needs_reload(runner, pending.opts, pending.shift):
                    self._use(runner, pending.keep_alive_s)
                    pending.future.set_result(runner)
                    return
                victim, reason = runner, "options changed"
                self._reloading.add(runner.spec.name)
            elif len(self.loaded) >= self.config.max_runners:
                victim = self._runner_to_unload()
            else:
                outcome = self._load(pending, require_full=bool(self.loaded))
                if outcome is _Outcome.DONE:
                    return
                if pending.oom_retry and self.loaded:
                    await self._evict_all_and_wait(pending.spec.name)
                    continue
                if outcome is _Outcome.RETRY:
                    continue
                victim = self._runner_to_unload()
            if victim is None:
                continue
            if reason == "evicted":
                self.stats.evictions += 1
            self._expire(victim, reason)
            await victim.gone.wait()

    def _load(self, pending: _Pending, *, require_full: bool) -> _Outcome:
        spec = pending.spec
        free = {d: self.vgpu.free_bytes(d) for d in sorted(self.vgpu.devices)}
        plan = plan_load(self.config, spec, pending.opts, free, others_loaded=require_full)
        if plan is None:
            return _Outcome.EVICT
        process = "llama-server" if self.config.era == "e3" else "ollama runner"  # E2: Ollama's own runner
        pid = self.vgpu.spawn(f"{process} {spec.name}")
        failure = self.vgpu.try_allocate_buffers(pid, buffers(plan.cost, plan.placement))
        if failure is not None:
            self.vgpu.kill(pid)
            self.stats.load_failures += 1
            self.stats.event(
                self.clock.now(), "load_failed", model=spec.name, num_ctx=plan.num_ctx, bytes=plan.cost.total_bytes
            )
            return self._after_oom(pending, failure_error=load_oom(failure, self.config.era))
        self._register(pending, pid, plan)
        return _Outcome.DONE

    def _after_oom(self, pending: _Pending, *, failure_error: SimError) -> _Outcome:
        if self.config.era == "e3" and not pending.oom_retry:
            lower = _next_lower_tier(pending.opts.runner.num_ctx)
            if pending.opts.num_ctx_auto and lower is not None:
                pending.oom_retry = True
                pending.opts = replace(pending.opts, runner=replace(pending.opts.runner, num_ctx=lower))
                return _Outcome.RETRY
            if self.loaded:
                pending.oom_retry = True
                return _Outcome.RETRY
        pending.future.set_exception(failure_error)
        return _Outcome.DONE

    def _register(self, pending: _Pending, pid: int, plan: LoadPlan) -> None:
        spec, opts, cfg = pending.spec, pending.opts, self.config
        num_ctx, num_parallel = plan.num_ctx, plan.num_parallel
        stored = opts.runner if cfg.era == "e2" else replace(opts.runner, num_ctx=num_ctx, num_batch=plan.num_batch)
        state = LoadedState(stored, opts.num_ctx_auto, opts.num_batch_auto, pending.shift, spec.n_ctx_train)
        slot_ctx = ollama_cells(AttentionLayers.of(spec), num_ctx=num_ctx, num_parallel=num_parallel).slot_ctx
        session = cfg.keep_alive_s if pending.keep_alive_s is None else pending.keep_alive_s
        runner = LoadedRunner(
            spec=spec,
            pid=pid,
            state=state,
            cost=plan.cost,
            placement=plan.placement,
            offload=plan.offload,
            num_parallel=num_parallel,
            num_ctx=num_ctx,
            slot_ctx=slot_ctx,
            session_s=session,
            loaded_at_s=self.clock.now(),
            ref_count=1,
        )
        self.loaded[spec.name] = runner
        self.stats.loads += 1
        reload = spec.name in self._reloading
        self._reloading.discard(spec.name)
        self.stats.reloads += int(reload)
        offloaded: dict[str, int] = {}
        if plan.offload is not None:
            self.stats.partial_offloads += 1
            offloaded = {
                "gpu_layers": plan.offload.gpu_layers,
                "n_layers": plan.offload.n_layers,
                "host_bytes": plan.offload.host_bytes,
            }
        self.stats.event(
            self.clock.now(),
            "reload" if reload else "load",
            model=spec.name,
            num_ctx=num_ctx,
            num_parallel=num_parallel,
            bytes=plan.cost.total_bytes,
            **offloaded,
        )
        self._spawn(self._finish_load(runner, pending))
        pending.future.set_result(runner)

    async def _finish_load(self, runner: LoadedRunner, pending: _Pending) -> None:
        loading = asyncio.ensure_future(self.clock.sleep(self.config.load_s))
        left = asyncio.ensure_future(pending.gone.wait())
        await asyncio.wait({loading, left}, return_when=asyncio.FIRST_COMPLETED)
        for task in (loading, left):
            task.cancel()
        if not loading.done() or loading.cancelled():
            runner.error = load_aborted(self.config.era)
            self._expire(runner, "load aborted: the client went away")
        runner.ready.set()

    # ---- runner lifetime ------------------------------------------------------------------------------

    def _needs_reload(self, runner: LoadedRunner, opts: Options, shift: bool) -> bool:
        if not runner.usable:
            return True
        return needs_reload(runner.state, opts, shift=shift, era=self.config.era)

    def _use(self, runner: LoadedRunner, keep_alive_s: float | None) -> None:
        runner.ref_count += 1
        runner.cancel_timer()
        if keep_alive_s is not None:
            runner.session_s = keep_alive_s

    def _expire(self, runner: LoadedRunner, reason: str) -> None:
        runner.cancel_timer()
        runner.session_s = 0
        if runner.ref_count <= 0:
            self._unload(runner, reason)
        else:
            self.stats.event(
                self.clock.now(), "expiring", model=runner.spec.name, reason=reason, in_flight=runner.ref_count
            )

    def _unload(self, runner: LoadedRunner, reason: str) -> None:
        if runner.unloaded:
            return
        runner.unloaded = True
        runner.cancel_timer()
        self.vgpu.kill(runner.pid)
        if self.loaded.get(runner.spec.name) is runner:
            del self.loaded[runner.spec.name]
        self.stats.unloads += 1
        self.stats.event(self.clock.now(), "unload", model=runner.spec.name, reason=reason)
        runner.ready.set()
        runner.gone.set()

    async def _keep_alive(self, runner: LoadedRunner) -> None:
        await self.clock.sleep(runner.session_s)
        runner.timer = None
        if runner.ref_count <= 0:
            self._unload(runner, "keep_alive elapsed")

    def _runner_to_unload(self) -> LoadedRunner | None:
        """``findRunnerToUnload``: by shortest session, then name; idle ones first."""
        ordered = sorted(self.loaded.values(), key=lambda r: (r.session_s, r.spec.name))
        idle = [r for r in ordered if r.ref_count <= 0]
        candidates = idle or ordered
        return candidates[0] if candidates else None

    async def _evict_all_and_wait(self, keep: str) -> None:
        victims = [r for name, r in self.loaded.items() if name != keep]
        for runner in victims:
            self.stats.evictions += 1
            self._expire(runner, "evicted for an out-of-memory retry")
        for runner in victims:
            await runner.gone.wait()

    def _at(self, seconds: float) -> datetime:
        return self.clock.wall() + timedelta(seconds=seconds)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _next_lower_tier(num_ctx: int) -> int | None:
    if num_ctx > 32768:
        return 32768
    if num_ctx > 4096:
        return 4096
    return None
