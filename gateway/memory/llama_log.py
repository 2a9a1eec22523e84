"""Parse llama-server's load-time memory log lines (printed at -lv 4; llama-server.md section 4).

    load_tensors:   CPU_Mapped model buffer size =    15.80 MiB
    llama_context:        CPU  output buffer size =     0.98 MiB
    llama_kv_cache:        CPU KV buffer size =     1.00 MiB
    llama_kv_cache: size =    1.00 MiB (  2048 cells,   2 layers,  2/2 seqs), K (f16):    0.50 MiB, V (f16):    0.50 MiB
    llama_memory_recurrent:        CPU RS buffer size =     0.12 MiB
    sched_reserve:        CPU compute buffer size =     3.14 MiB

The values are MiB with two decimals, so each is exact to +-0.005 MiB (about 5 KiB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 1024 * 1024

_BUFFER = re.compile(
    r"(?P<who>load_tensors|llama_context|llama_kv_cache|llama_memory_recurrent|sched_reserve):\s+"
    r"(?P<device>\S+)\s+(?P<kind>model|output|KV|RS|compute) buffer size =\s*(?P<mib>[0-9.]+) MiB"
)
_KV_SUMMARY = re.compile(
    r"llama_kv_cache: size =\s*(?P<total>[0-9.]+) MiB \(\s*(?P<cells>\d+) cells,\s*(?P<layers>\d+) layers,\s*"
    r"(?P<seqs>\d+)/(?P<streams>\d+) seqs\), K \((?P<type_k>\w+)\):\s*(?P<k>[0-9.]+) MiB, "
    r"V \((?P<type_v>\w+)\):\s*(?P<v>[0-9.]+) MiB"
)
_SLOTS = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(true|false)'")


@dataclass(frozen=True)
class LoggedKvCache:
    """One ``llama_kv_cache: size = ...`` line (an SWA model logs two: the full cache, then the SWA cache)."""

    cells: int  # per stream
    layers: int
    seqs: int
    streams: int
    type_k: str
    type_v: str
    k_mib: float
    v_mib: float
    total_mib: float


@dataclass(frozen=True)
class LoggedBuffers:
    """Bytes per buffer kind, summed over devices; ``*_by_device`` keeps the split (``CUDA0``, ``CPU``...)."""

    model_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0
    recurrent_bytes: int = 0
    by_device: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes + self.recurrent_bytes

    @property
    def gpu_bytes(self) -> int:
        """Bytes in device memory: every buffer except CPU ones and pinned host buffers (``CUDA_Host``)."""
        return sum(v for k, v in self.by_device.items() if not k.startswith("CPU") and not k.endswith("_Host"))


@dataclass(frozen=True)
class LoggedSlots:
    n_slots: int
    n_ctx_slot: int
    kv_unified: bool


def mib_to_bytes(mib: float) -> int:
    return round(mib * MIB)


def bytes_to_logged_mib(n_bytes: int) -> str:
    """How llama.cpp prints a byte count (``%.2f`` MiB)."""
    return f"{n_bytes / MIB:.2f}"


def parse_kv_caches(log_text: str) -> list[LoggedKvCache]:
    return [
        LoggedKvCache(
            cells=int(m["cells"]),
            layers=int(m["layers"]),
            seqs=int(m["seqs"]),
            streams=int(m["streams"]),
            type_k=m["type_k"],
            type_v=m["type_v"],
            k_mib=float(m["k"]),
            v_mib=float(m["v"]),
            total_mib=float(m["total"]),
        )
        for m in _KV_SUMMARY.finditer(log_text)
    ]


_KIND_FIELD = {"model": "model_bytes", "KV": "kv_bytes", "compute": "compute_bytes", "output": "output_bytes",
               "RS": "recurrent_bytes"}


def parse_buffers(log_text: str) -> LoggedBuffers:
    """Sum of every ``... buffer size = X MiB`` line, by kind and by device (of the last load in the log)."""
    matches = list(_BUFFER.finditer(log_text))
    starts = [
        i for i, m in enumerate(matches) if m["kind"] == "model" and (i == 0 or matches[i - 1]["kind"] != "model")
    ]
    totals = dict.fromkeys(_KIND_FIELD.values(), 0)
    by_device: dict[str, int] = {}
    for match in matches[starts[-1] if starts else 0 :]:
        n_bytes = mib_to_bytes(float(match["mib"]))
        totals[_KIND_FIELD[match["kind"]]] += n_bytes
        device = match["device"].removesuffix("_Mapped")
        by_device[device] = by_device.get(device, 0) + n_bytes
    return LoggedBuffers(by_device=by_device, **totals)


def parse_slots(log_text: str) -> LoggedSlots | None:
    """The server's ``initializing, n_slots = .., n_ctx_slot = .., kv_unified = '..'`` line (any verbosity)."""
    matches = list(_SLOTS.finditer(log_text))
    if not matches:
        return None
    n_slots, n_ctx_slot, unified = matches[-1].groups()
    return LoggedSlots(n_slots=int(n_slots), n_ctx_slot=int(n_ctx_slot), kv_unified=unified == "true")
