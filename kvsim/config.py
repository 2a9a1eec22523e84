"""The simulator's configuration: one frozen object, built once (from CLI arguments or in a test)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvsim.catalog import DEFAULT_MODELS
from kvsim.gpu.kv_cache import CacheType, parse_cache_type
from kvsim.gpu.vgpu import GIB

Mode = Literal["ollama", "llama-server"]
Era = Literal["e3", "e2"]
ERA_VERSIONS: dict[str, str] = {"e3": "0.30.0", "e2": "0.20.0"}
DEFAULT_KEEP_ALIVE_S = 300.0


@dataclass(frozen=True)
class SimConfig:
    """Ollama's environment (OLLAMA_*), the virtual GPUs, speeds, and the llama-server mode's flags."""

    mode: Mode = "ollama"
    era: Era = "e3"
    gpu_bytes: tuple[int, ...] = (24 * GIB,)
    models: tuple[str, ...] = DEFAULT_MODELS
    # Ollama environment
    num_parallel: int = 1  # OLLAMA_NUM_PARALLEL
    max_loaded_models: int = 0  # OLLAMA_MAX_LOADED_MODELS; 0 = 3 per GPU
    max_queue: int = 512  # OLLAMA_MAX_QUEUE
    context_length: int = 0  # OLLAMA_CONTEXT_LENGTH; 0 = the VRAM tier
    gpu_overhead_bytes: int = 0  # OLLAMA_GPU_OVERHEAD (E3: only for the VRAM tier)
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S  # OLLAMA_KEEP_ALIVE
    kv_cache_type: str = "f16"  # OLLAMA_KV_CACHE_TYPE / -ctk -ctv
    dynamic_kv: bool = False  # grow KV per token (transformers-style) instead of reserving it at load
    llama_fit: bool = True  # LLAMA_ARG_FIT: E3's first model may partly offload to the CPU instead of OOMing
    # timing and determinism
    load_s: float = 2.0  # seconds a (re)load takes
    prompt_tokens_per_s: float = 4000.0
    gen_tokens_per_s: float = 60.0
    min_response_tokens: int = 16
    max_response_tokens: int = 160
    seed: int = 0
    time_scale: float = 1.0  # simulated seconds per real second
    # llama-server mode: one model, -c / -np / -kvu
    server_model: str = "llama3.1:8b"
    ctx_size: int = 4096
    n_parallel: int = -1  # -1 = auto: 4 slots on a unified pool
    kv_unified: bool | None = None  # None = unified exactly when n_parallel is auto
    embeddings: bool = False  # --embeddings: the embedding routes answer (else 501); they take slots and cells
    reranking: bool = False  # --reranking: the rerank routes answer (and, as the real flag does, embeddings too)
    version: str | None = None  # /api/version; default per era
    # converted tokenizers (tokenizer.json, kvgate's cache format and keys) are kept and reused here; None = convert
    # in memory, once per process
    tokenizer_cache_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.gpu_bytes or min(self.gpu_bytes) <= 0:
            raise ValueError(f"gpu_bytes needs at least one positive size, got {self.gpu_bytes}")
        if self.num_parallel < 1:
            raise ValueError(f"num_parallel must be >= 1, got {self.num_parallel}")
        if self.min_response_tokens < 1 or self.max_response_tokens < self.min_response_tokens:
            raise ValueError("response tokens need 1 <= min_response_tokens <= max_response_tokens")
        if self.prompt_tokens_per_s <= 0 or self.gen_tokens_per_s <= 0 or self.time_scale <= 0:
            raise ValueError("speeds and time_scale must be > 0")
        if self.n_parallel == 0 or self.n_parallel < -1:
            raise ValueError(f"n_parallel must be -1 (auto) or >= 1, got {self.n_parallel}")
        parse_cache_type(self.kv_cache_type)

    @property
    def cache_type(self) -> CacheType:
        return parse_cache_type(self.kv_cache_type)

    @property
    def ollama_version(self) -> str:
        return self.version or ERA_VERSIONS[self.era]

    @property
    def max_runners(self) -> int:
        return self.max_loaded_models or 3 * len(self.gpu_bytes)

    @property
    def default_num_ctx(self) -> int:
        """OLLAMA_CONTEXT_LENGTH, or the tier from total VRAM minus OLLAMA_GPU_OVERHEAD (v0.15.5+)."""
        if self.context_length:
            return self.context_length
        usable = sum(self.gpu_bytes) - self.gpu_overhead_bytes
        if usable >= 47 * GIB:
            return 262144
        if usable >= 23 * GIB:
            return 32768
        return 4096
