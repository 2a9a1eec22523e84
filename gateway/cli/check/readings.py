"""What ``kvgate check`` gathered, as frozen data: the one input of ``diagnose`` (no I/O here).

Every backend setting that decides memory is kept with where it was learned (``Known``): the backend's own answers
(/props, /slots, /api/ps), its log (``--log``), kvgate's config, or nothing ("unknown": the diagnosis says so
instead of guessing). Ollama reports neither OLLAMA_NUM_PARALLEL nor the KV cache type nor flash attention over
HTTP; its start-up log line ``server config env=...`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gateway.cli.check.backend_log import LogSettings, env_int
from gateway.cli.check.signatures import SignatureMatch
from gateway.config.settings import BackendSettings
from gateway.memory.host_ram import HostRam
from gateway.memory.kv import CacheType
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.llama_server_answers import ServerProps, SlotState
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.memory.vram import VramReading

T = TypeVar("T")


@dataclass(frozen=True)
class Known(Generic[T]):
    value: T | None
    source: str  # "log", "config", "/props", "assumed", "unknown", ...

    @property
    def known(self) -> bool:
        return self.value is not None


def unknown() -> Known[T]:
    return Known(None, "unknown")


@dataclass(frozen=True)
class ResidentModel:
    """An Ollama /api/ps entry and the profile /api/show gave for it (None, with why, when it gave none)."""

    loaded: LoadedModel
    profile: ModelProfile | None
    problem: str | None = None


@dataclass(frozen=True)
class BackendSettingsSeen:
    parallel: Known[int] = field(default_factory=unknown)
    unified: Known[bool] = field(default_factory=unknown)
    type_k: Known[str] = field(default_factory=unknown)
    type_v: Known[str] = field(default_factory=unknown)
    flash_attn: Known[bool] = field(default_factory=unknown)
    max_loaded_models: Known[int] = field(default_factory=unknown)
    gpu_overhead_bytes: Known[int] = field(default_factory=unknown)


@dataclass(frozen=True)
class BackendReadings:
    name: str
    kind: str
    url: str
    problem: str | None = None  # unreachable, or an answer kvgate could not read
    version: str | None = None
    residents: tuple[ResidentModel, ...] = ()
    props: ServerProps | None = None
    slots: tuple[SlotState, ...] = ()
    served_profile: ModelProfile | None = None
    settings: BackendSettingsSeen = BackendSettingsSeen()
    vram: VramReading | None = None
    vram_problem: str | None = None  # None with vram None: no VRAM source configured
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostReadings:
    ram: HostRam | None = None
    ram_problem: str | None = None
    kernel_oom_lines: tuple[str, ...] = ()
    kernel_problem: str | None = None  # "not readable: ..."; None when it was read
    kernel_source: str = ""


@dataclass(frozen=True)
class Readings:
    backends: tuple[BackendReadings, ...]
    host: HostReadings = HostReadings()
    log_matches: tuple[SignatureMatch, ...] = ()
    logs_read: tuple[str, ...] = ()
    longest_prompt: Known[int] = field(default_factory=unknown)


def resolve_settings(
    kind: str, config: BackendSettings, log: LogSettings, props: ServerProps | None
) -> BackendSettingsSeen:
    """Each memory setting from the best source that says it: the log, then the backend's answers, then config."""
    env = log.ollama_env
    parallel: Known[int] = unknown()
    if log.n_slots is not None:
        parallel = Known(log.n_slots, "log")
    elif props is not None:
        parallel = Known(props.total_slots, "/props total_slots")
    elif env_int(env, "OLLAMA_NUM_PARALLEL") is not None:
        parallel = Known(env_int(env, "OLLAMA_NUM_PARALLEL"), "log (OLLAMA_NUM_PARALLEL)")
    elif config.parallel is not None:
        parallel = Known(config.parallel, "kvgate config (parallel)")
    elif kind == "ollama":
        parallel = Known(1, "assumed (Ollama's default OLLAMA_NUM_PARALLEL=1; pass --log or set parallel)")
    unified: Known[bool] = unknown()
    if kind == "ollama":
        unified = Known(False, "Ollama always splits its pool per sequence")
    elif log.kv_unified is not None:
        unified = Known(log.kv_unified, "log")
    elif config.unified_kv is not None:
        unified = Known(config.unified_kv, "kvgate config (unified_kv)")
    elif props is not None and props.total_slots == 1:
        unified = Known(False, "one slot (unified and split coincide)")
    types = []
    for logged, field_name in ((log.type_k, "cache_type_k"), (log.type_v, "cache_type_v")):
        if logged:
            types.append(Known(logged, "log"))
        elif getattr(config, field_name) != CacheType.F16:  # f16 is also the unset default: it says nothing
            types.append(Known(str(getattr(config, field_name)), f"kvgate config ({field_name})"))
        elif kind == "ollama" and "OLLAMA_KV_CACHE_TYPE" in env:
            types.append(Known("f16", "log (OLLAMA_KV_CACHE_TYPE unset: f16)"))
        else:
            types.append(unknown())
    max_loaded: Known[int] = unknown()
    if env_int(env, "OLLAMA_MAX_LOADED_MODELS") is not None:
        max_loaded = Known(env_int(env, "OLLAMA_MAX_LOADED_MODELS"), "log (OLLAMA_MAX_LOADED_MODELS)")
    elif config.max_loaded_models is not None:
        max_loaded = Known(config.max_loaded_models, "kvgate config (max_loaded_models)")
    overhead = env_int(env, "OLLAMA_GPU_OVERHEAD")
    return BackendSettingsSeen(
        parallel=parallel, unified=unified, type_k=types[0], type_v=types[1],
        flash_attn=Known(log.flash_attn, "log") if log.flash_attn is not None else unknown(),
        max_loaded_models=max_loaded,
        gpu_overhead_bytes=Known(overhead, "log (OLLAMA_GPU_OVERHEAD)") if overhead is not None else unknown(),
    )
