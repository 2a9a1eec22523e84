"""Findings as data, and the table of which setting turns which knob on each kind of backend (pure).

A Finding says what is wrong (or fine), the evidence, and the fix: the setting, the value to set it to, and where
that setting lives (the Ollama server's environment, llama-server's command line, kvgate's config, the GPU host).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any


class Severity(IntEnum):
    """Ordered: the worst finding decides the exit code (render.exit_code)."""

    OK = 0
    INFO = 1
    WARNING = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()


class Knob(StrEnum):
    CONTEXT = "context"
    PARALLEL = "parallel"
    KV_TYPE = "kv_type"
    FLASH_ATTN = "flash_attn"
    MAX_LOADED = "max_loaded"
    GPU_OVERHEAD = "gpu_overhead"
    SPLIT_POOL = "split_pool"
    SYSTEM_RAM = "system_ram"
    OTHER_PROCESS = "other_process"


@dataclass(frozen=True)
class Fix:
    setting: str
    value: str
    where: str

    def to_json(self) -> dict[str, str]:
        return {"setting": self.setting, "value": self.value, "where": self.where}

    def __str__(self) -> str:
        return f"{self.setting}={self.value} ({self.where})" if self.value else f"{self.setting} ({self.where})"


@dataclass(frozen=True)
class Finding:
    """One result of the check; ``code`` is stable (scripts match on it), ``what`` is one sentence for people."""

    code: str
    severity: Severity
    what: str
    evidence: tuple[str, ...] = ()
    fix: Fix | None = None
    alternatives: tuple[Fix, ...] = ()
    backend: str | None = None
    data: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code, "severity": self.severity.label, "backend": self.backend, "what": self.what,
            "evidence": list(self.evidence), "fix": self.fix.to_json() if self.fix else None,
            "alternatives": [alt.to_json() for alt in self.alternatives], "data": self.data,
        }


OLLAMA_ENV = "Ollama server environment; restart Ollama"
LLAMA_ARGS = "llama-server command line; restart it"
GPU_HOST = "the GPU host"
KVGATE_CONFIG = "kvgate config, [[backends]]"

_SETTINGS: dict[Knob, dict[str, tuple[str, str]]] = {
    Knob.CONTEXT: {"ollama": ("OLLAMA_CONTEXT_LENGTH", OLLAMA_ENV), "llama-server": ("-c", LLAMA_ARGS)},
    Knob.PARALLEL: {"ollama": ("OLLAMA_NUM_PARALLEL", OLLAMA_ENV), "llama-server": ("-np", LLAMA_ARGS)},
    Knob.KV_TYPE: {"ollama": ("OLLAMA_KV_CACHE_TYPE", OLLAMA_ENV), "llama-server": ("-ctk/-ctv", LLAMA_ARGS)},
    Knob.FLASH_ATTN: {"ollama": ("OLLAMA_FLASH_ATTENTION", OLLAMA_ENV), "llama-server": ("-fa", LLAMA_ARGS)},
    Knob.MAX_LOADED: {"ollama": ("OLLAMA_MAX_LOADED_MODELS", OLLAMA_ENV),
                      "llama-server": ("one model per llama-server", LLAMA_ARGS)},
    Knob.GPU_OVERHEAD: {"ollama": ("OLLAMA_GPU_OVERHEAD", OLLAMA_ENV), "llama-server": ("-c", LLAMA_ARGS)},
    Knob.SPLIT_POOL: {"ollama": ("OLLAMA_NUM_PARALLEL", OLLAMA_ENV),
                      "llama-server": ("-np N -no-kvu (split slots)", LLAMA_ARGS)},
    Knob.SYSTEM_RAM: {"ollama": ("OLLAMA_MAX_LOADED_MODELS", OLLAMA_ENV),
                      "llama-server": ("-ngl (all layers on the GPU) with a smaller -c", LLAMA_ARGS)},
    Knob.OTHER_PROCESS: {"ollama": ("the other GPU process", GPU_HOST), "llama-server": ("the other GPU process",
                                                                                         GPU_HOST)},
}
_DEFAULT_VALUES: dict[Knob, dict[str, str]] = {
    Knob.CONTEXT: {"ollama": "half the loaded context_length", "llama-server": "half the current -c"},
    Knob.PARALLEL: {"ollama": "1", "llama-server": "1"},
    Knob.KV_TYPE: {"ollama": "q8_0", "llama-server": "q8_0"},
    Knob.FLASH_ATTN: {"ollama": "1", "llama-server": "on"},
    Knob.MAX_LOADED: {"ollama": "1", "llama-server": ""},
    Knob.GPU_OVERHEAD: {"ollama": "the bytes the other processes hold", "llama-server": "half the current -c"},
    Knob.SPLIT_POOL: {"ollama": "1", "llama-server": "the current slot count"},
    Knob.SYSTEM_RAM: {"ollama": "1", "llama-server": "999"},
    Knob.OTHER_PROCESS: {"ollama": "stop it (nvidia-smi lists it)", "llama-server": "stop it (nvidia-smi lists it)"},
}


def fix_for(knob: Knob, kind: str, value: str | None = None) -> Fix:
    """The fix that turns ``knob`` on a backend of ``kind`` (ollama, llama-server; anything else is described as
    llama-server's flags, the usual engine underneath), to ``value`` or the knob's usual value."""
    family = "ollama" if kind == "ollama" else "llama-server"
    setting, where = _SETTINGS[knob][family]
    return Fix(setting, value if value is not None else _DEFAULT_VALUES[knob][family], where)
