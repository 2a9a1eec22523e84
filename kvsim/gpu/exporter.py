"""The virtual GPU as a GPU host exports it to Prometheus: nvidia_gpu_exporter's ``/metrics`` text.

A gateway reads the simulator's GPU the way it reads a real one on another host, through an exporter URL
(``vram = "http://127.0.0.1:<port>/sim/metrics"``), never through anything simulator-specific. The metric names
and labels are nvidia_gpu_exporter's (utkuozdemir/nvidia_gpu_exporter, which converts ``nvidia-smi
--query-gpu`` fields; memory in bytes)::

    nvidia_smi_gpu_info{name="Simulated GPU 0",uuid="SIM-GPU-0",...} 1
    nvidia_smi_index{uuid="SIM-GPU-0"} 0
    nvidia_smi_memory_total_bytes{uuid="SIM-GPU-0"} 25769803776
    nvidia_smi_memory_used_bytes{uuid="SIM-GPU-0"} 5368709120
    nvidia_smi_memory_free_bytes{uuid="SIM-GPU-0"} 20401094656

Values are whole bytes, written as integers (exact: a Prometheus float holds integers up to 2**53). Like a real
exporter it reports no per-process usage; the simulator's own ``GET /sim/gpu`` (JSON) lists the processes.
Pure: the snapshot in, the text out.
"""

from __future__ import annotations

from collections.abc import Callable

from kvsim.gpu.vgpu import DeviceUsage, GpuSnapshot

EXPORTER_PATH = "/sim/metrics"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_GAUGES: tuple[tuple[str, str, Callable[[DeviceUsage], int]], ...] = (
    ("nvidia_smi_index", "index", lambda d: d.index),
    ("nvidia_smi_memory_total_bytes", "memory.total [MiB]", lambda d: d.total_bytes),
    ("nvidia_smi_memory_used_bytes", "memory.used [MiB]", lambda d: d.used_bytes),
    ("nvidia_smi_memory_free_bytes", "memory.free [MiB]", lambda d: d.free_bytes),
)


def device_uuid(index: int) -> str:
    return f"SIM-GPU-{index}"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exporter_text(snapshot: GpuSnapshot) -> str:
    """The devices of ``snapshot`` in nvidia_gpu_exporter's exposition format."""
    lines = ["# HELP nvidia_smi_gpu_info A metric with a constant '1' value labeled by gpu uuid, name.",
             "# TYPE nvidia_smi_gpu_info gauge"]
    for d in snapshot.devices:
        lines.append(f'nvidia_smi_gpu_info{{name="{_label(d.name)}",uuid="{device_uuid(d.index)}"}} 1')
    for metric, field, value in _GAUGES:
        lines += [f"# HELP {metric} {field}", f"# TYPE {metric} gauge"]
        lines += [f'{metric}{{uuid="{device_uuid(d.index)}"}} {int(value(d))}' for d in snapshot.devices]
    return "\n".join(lines) + "\n"
