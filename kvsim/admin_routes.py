"""The simulator's own routes: the virtual GPU, foreign processes, and counters.

GET    /sim/gpu                 devices (total/used/free bytes) and processes, with a timestamp
GET    /sim/metrics             the devices as nvidia_gpu_exporter's Prometheus text (what a gateway reads)
GET    /sim/processes           the processes on the virtual GPU
POST   /sim/processes           {"name": "trainer", "bytes": 8589934592, "device": 0} -> 201 {"pid": ...}
DELETE /sim/processes/{pid}     end a foreign process (404 if there is none)
GET    /sim/stats               loads, reloads, evictions, OOMs, truncations, the event log
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from kvsim.gpu.exporter import CONTENT_TYPE, EXPORTER_PATH, exporter_text
from kvsim.gpu.vgpu import GpuSnapshot
from kvsim.state import SIM_STATE, SimState


def snapshot_json(snapshot: GpuSnapshot, taken_at_s: float) -> dict[str, Any]:
    return {
        "taken_at_s": taken_at_s,
        "version": snapshot.version,
        "devices": [
            {
                "index": d.index,
                "name": d.name,
                "total_bytes": d.total_bytes,
                "used_bytes": d.used_bytes,
                "free_bytes": d.free_bytes,
            }
            for d in snapshot.devices
        ],
        "processes": [
            {"pid": p.pid, "name": p.name, "device": p.device, "used_bytes": p.used_bytes, "foreign": p.foreign}
            for p in snapshot.processes
        ],
    }


def _reply(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


async def gpu(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    return _reply(200, snapshot_json(state.vgpu.snapshot(), state.clock.now()))


async def metrics(request: web.Request) -> web.Response:
    text = exporter_text(request.app[SIM_STATE].vgpu.snapshot())
    return web.Response(status=200, body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


async def processes(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    return _reply(200, snapshot_json(state.vgpu.snapshot(), state.clock.now())["processes"])


async def add_process(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return _reply(400, {"error": f"body is not JSON: {exc}"})
    nbytes, device = body.get("bytes") if isinstance(body, dict) else None, 0
    if isinstance(body, dict):
        device = body.get("device", 0)
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
        return _reply(400, {"error": 'field "bytes" must be a positive integer (bytes to hold on the GPU)'})
    if not isinstance(device, int) or device not in state.vgpu.devices:
        return _reply(400, {"error": f'field "device" must be one of {sorted(state.vgpu.devices)}'})
    name = str(body.get("name") or "foreign-process")
    pid = state.vgpu.add_foreign(name, device, nbytes)
    state.stats.event(state.clock.now(), "foreign_process", pid=pid, name=name, bytes=nbytes, device=device)
    return _reply(201, {"pid": pid, "name": name, "device": device, "bytes": nbytes})


async def remove_process(request: web.Request) -> web.Response:
    state: SimState = request.app[SIM_STATE]
    try:
        pid = int(request.match_info["pid"])
    except ValueError:
        return _reply(400, {"error": "pid must be an integer"})
    proc = state.vgpu.process(pid)
    if proc is None or not proc.foreign:
        return _reply(404, {"error": f"no foreign process with pid {pid}"})
    state.vgpu.kill(pid)
    state.stats.event(state.clock.now(), "foreign_process_ended", pid=pid)
    return _reply(200, {"pid": pid, "removed": True})


async def stats(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    body = state.stats.to_json()
    body["host_ram_bytes"] = 0  # system RAM the runners hold: what /api/ps puts outside the GPU (size - size_vram)
    if state.service is not None:
        runners = list(state.service.scheduler.loaded.values())
        body["host_ram_bytes"] = sum(r.host_bytes for r in runners if not r.crashed)
        body["loaded"] = [
            {
                "model": r.spec.name,
                "num_ctx": r.num_ctx,
                "num_parallel": r.num_parallel,
                "bytes": r.vram_bytes,  # on the GPU
                "host_bytes": r.host_bytes,  # in system RAM (a partial offload)
                "gpu_layers": r.offload.gpu_layers if r.offload else r.spec.arch.n_layers,
                "n_layers": r.spec.arch.n_layers,
                "ref_count": r.ref_count,
                "crashed": r.crashed,
            }
            for r in runners
        ]
    return _reply(200, body)


def add_admin_routes(app: web.Application) -> None:
    app.router.add_get("/sim/gpu", gpu)
    app.router.add_get(EXPORTER_PATH, metrics)
    app.router.add_get("/sim/processes", processes)
    app.router.add_post("/sim/processes", add_process)
    app.router.add_delete("/sim/processes/{pid}", remove_process)
    app.router.add_get("/sim/stats", stats)
