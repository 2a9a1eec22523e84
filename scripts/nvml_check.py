#!/usr/bin/env python3
"""Compare kvgate's NVML readings with nvidia-smi; exit 1 when they disagree beyond a tolerance.

    python scripts/nvml_check.py                    table of both readings, per GPU and per process
    python scripts/nvml_check.py --tolerance-mib 32
    python scripts/nvml_check.py --hold-gib 1       first start a process that holds 1 GiB (CUDA driver API),
                                                    so the per-process comparison has something to compare
    python scripts/nvml_check.py --record out.json  also save the raw NVML answers (replayed by the test fake)

Exit status: 0 agree, 1 disagree, 2 a reading could not be taken.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.memory.vram import VramReading, VramUnavailable
from gateway.memory.vram_nvml import NvmlSource

MIB = 1024 * 1024
SMI_GPU = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,memory.used,memory.free",
           "--format=csv,noheader,nounits"]
SMI_APPS = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader,nounits"]


def _csv(command: list[str]) -> list[list[str]]:
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=30).stdout  # noqa: S603
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def smi_reading() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    gpus = [
        {"index": int(i), "uuid": u, "name": n, "total_mib": int(t), "used_mib": int(us), "free_mib": int(f)}
        for i, u, n, t, us, f in _csv(SMI_GPU)
    ]
    apps = []
    for row in _csv(SMI_APPS):
        pid, name, used, uuid = row[0], ",".join(row[1:-2]), row[-2], row[-1]
        apps.append({"pid": int(pid), "name": name, "used_mib": int(used) if used.isdigit() else None, "uuid": uuid})
    return gpus, apps


def compare(reading: VramReading, gpus: list[dict[str, Any]], apps: list[dict[str, Any]], tolerance_mib: int) -> int:
    failures = 0
    print(f"{'GPU':<5}{'field':<8}{'kvgate MiB':>12}{'nvidia-smi MiB':>16}{'diff':>8}  verdict")
    by_uuid = {g["uuid"]: g for g in gpus}
    for device in reading.devices:
        smi = by_uuid.get(device.uuid)
        if smi is None:
            print(f"{device.index:<5}{'-':<8} nvidia-smi does not list {device.uuid}")
            failures += 1
            continue
        for field, ours in (("total", device.total_bytes), ("used", device.used_bytes), ("free", device.free_bytes)):
            ours_mib = ours / MIB
            diff = ours_mib - smi[f"{field}_mib"]
            ok = abs(diff) < tolerance_mib + 1  # nvidia-smi prints whole MiB
            failures += not ok
            print(f"{device.index:<5}{field:<8}{ours_mib:>12.0f}{smi[f'{field}_mib']:>16}{diff:>8.0f}  "
                  f"{'ok' if ok else 'DISAGREE'}")
    uuid_index = {d.uuid: d.index for d in reading.devices}
    ours_procs = {(p.pid, p.device_index): p for p in reading.processes}
    print(f"\n{'pid':<9}{'GPU':<5}{'name':<28}{'kvgate MiB':>12}{'nvidia-smi MiB':>16}  verdict")
    for app in apps:
        index = uuid_index.get(app["uuid"], -1)
        proc = ours_procs.pop((app["pid"], index), None)
        proc_mib = None if proc is None or proc.used_bytes is None else proc.used_bytes / MIB
        ok = proc is not None and (proc_mib is None or app["used_mib"] is None
                                   or abs(proc_mib - app["used_mib"]) < tolerance_mib + 1)
        failures += not ok
        shown = "-" if proc_mib is None else f"{proc_mib:.0f}"
        print(f"{app['pid']:<9}{index:<5}{app['name'][-27:]:<28}{shown:>12}{app['used_mib']!s:>16}  "
              f"{'ok' if ok else 'DISAGREE'}")
    for proc in ours_procs.values():  # graphics-only processes are not in --query-compute-apps
        print(f"{proc.pid:<9}{proc.device_index:<5}{(proc.name or '?')[-27:]:<28}"
              f"{(proc.used_bytes or 0) / MIB:>12.0f}{'(not a compute app)':>16}")
    return failures


def _attrs(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(obj, n) for n in names if hasattr(obj, n)}


def record(nvml: Any, path: Path) -> None:
    """Save the raw answers of every NVML function NvmlSource calls."""
    nvml.nvmlInit()
    devices, names = [], {}
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            v2 = None
            if hasattr(nvml, "nvmlMemory_v2"):
                try:
                    v2 = _attrs(nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2),
                                ("total", "used", "free", "reserved", "version"))
                except nvml.NVMLError as exc:
                    v2 = {"error": str(exc)}
            procs = {}
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                procs[getter] = [_attrs(p, ("pid", "usedGpuMemory")) for p in getattr(nvml, getter)(h)]
                for p in procs[getter]:
                    try:
                        names[str(p["pid"])] = nvml.nvmlSystemGetProcessName(p["pid"])
                    except nvml.NVMLError as exc:
                        names[str(p["pid"])] = {"error": str(exc)}
            devices.append({
                "name": nvml.nvmlDeviceGetName(h), "uuid": nvml.nvmlDeviceGetUUID(h),
                "memory_v1": _attrs(nvml.nvmlDeviceGetMemoryInfo(h), ("total", "used", "free")),
                "memory_v2": v2, **procs,
            })
        data = {"driver_version": nvml.nvmlSystemGetDriverVersion(), "devices": devices, "process_names": names}
    finally:
        nvml.nvmlShutdown()
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"recorded NVML answers to {path}")


def hold_gpu_memory(n_bytes: int) -> None:
    """Child mode: allocate n_bytes on GPU 0 with the CUDA driver API, say 'ready', wait for stdin to close."""
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    for step, rc in (("cuInit", cuda.cuInit(0)), ("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0)),
                     ("cuCtxCreate", cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)),
                     ("cuMemAlloc", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n_bytes)))):
        if rc != 0:
            print(f"{step} failed: CUresult {rc}", flush=True)
            sys.exit(2)
    print("ready", flush=True)
    sys.stdin.read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tolerance-mib", type=int, default=64)
    parser.add_argument("--hold-gib", type=float, default=0.0)
    parser.add_argument("--record", type=Path)
    parser.add_argument("--hold-bytes-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hold_bytes_child:
        hold_gpu_memory(args.hold_bytes_child)
        return 0
    try:
        import pynvml
    except ImportError:
        print("pynvml (nvidia-ml-py) is not installed", file=sys.stderr)
        return 2
    holder = None
    if args.hold_gib > 0:
        holder = subprocess.Popen(  # noqa: S603
            [sys.executable, __file__, "--hold-bytes-child", str(int(args.hold_gib * 1024 * MIB))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert holder.stdout is not None
        print(f"holder process {holder.pid}: {holder.stdout.readline().strip()}")
        time.sleep(0.5)
    try:
        if args.record:
            record(pynvml, args.record)
        try:
            reading = NvmlSource(pynvml).read_sync()
        except VramUnavailable as exc:
            print(f"kvgate NVML reading failed: {exc}", file=sys.stderr)
            return 2
        try:
            gpus, apps = smi_reading()
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"nvidia-smi failed: {exc}", file=sys.stderr)
            return 2
        failures = compare(reading, gpus, apps, args.tolerance_mib)
    finally:
        if holder is not None:
            holder.communicate("", timeout=30)
    print(f"\n{'AGREE' if failures == 0 else f'{failures} DISAGREEMENT(S)'} (tolerance {args.tolerance_mib} MiB)")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
