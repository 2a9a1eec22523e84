"""Backends' settings (``[[backends]]``, and ``backend.*`` overrides of the first one from the environment)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from yarl import URL

from gateway.config.base import Strict, usable_key
from gateway.domain import BackendKind
from gateway.memory.kv import CacheType, parse_cache_type
from gateway.memory.vram import parse_size
from gateway.support.redact import mask_url

DEFAULT_BACKEND_URL = "http://127.0.0.1:11434"


def _server_root(value: str) -> str:
    url = URL(value)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("must be an http:// or https:// URL with a host, like http://127.0.0.1:11434")
    if url.path not in ("", "/") or url.query_string or url.fragment:
        raise ValueError("must be the server's root, with no path, query or fragment (kvgate appends each "
                         "request's own path), like http://127.0.0.1:11434")
    return str(url).rstrip("/")


def existing_file(value: Path | None) -> Path | None:
    if value is not None and not value.expanduser().is_file():
        raise ValueError(f"no such file: {value}; fix the path or remove the setting")
    return value




class TimeoutSettings(Strict):
    """How long to wait for a backend, in seconds."""

    connect_s: float = Field(default=5.0, gt=0)
    first_byte_s: float = Field(
        default=600.0, gt=0, description="until response headers; covers model loads and queues"
    )
    idle_s: float = Field(default=300.0, gt=0, description="between two chunks of a response")


class BackendSettings(Strict):
    """One LLM server behind the gateway."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: BackendKind = BackendKind.OLLAMA
    url: str = DEFAULT_BACKEND_URL
    api_key: SecretStr | None = None
    timeouts: TimeoutSettings = TimeoutSettings()
    parallel: int | None = Field(
        default=None, ge=1, le=256, description="sequences per model: OLLAMA_NUM_PARALLEL or llama-server -np "
        "(Ollama, unset: read from each model's /api/ps size)"
    )
    unified_kv: bool | None = Field(default=None, description="llama-server: one KV pool shared by all slots")
    context_tokens: int | None = Field(
        default=None, ge=256,
        description="Ollama: the num_ctx kvgate loads models with (a loaded model's own context wins); openai: "
        "the context per sequence (with parallel, it turns admission on)",
    )
    cache_type_k: CacheType = CacheType.F16
    cache_type_v: CacheType = CacheType.F16
    gguf_path: Path | None = Field(default=None, description="llama-server: the model file, for its metadata")
    vram: str | None = Field(
        default=None, description="'nvml', an exporter URL (dcgm-exporter or nvidia_gpu_exporter), or a size like "
        "'24GiB'"
    )
    vram_refresh_s: float = Field(default=2.0, gt=0)
    max_loaded_models: int | None = Field(
        default=None, ge=1, description="Ollama: its OLLAMA_MAX_LOADED_MODELS; unset: Ollama's default, 3 per GPU",
    )
    cpu_offload: Literal["auto", "on", "off"] = Field(
        default="auto", description="Ollama: whether it loads a model too big for the GPU partly on the CPU "
        "(llama.cpp's fit, LLAMA_ARG_FIT); auto: yes for Ollama 0.30+ (fit is on by default) or once /api/ps shows "
        "a model partly on the CPU, no for older versions or after such a load failed; off: LLAMA_ARG_FIT=off",
    )

    @field_validator("cache_type_k", "cache_type_v", mode="before")
    @classmethod
    def _cache_type(cls, value: object) -> object:
        return parse_cache_type(value) if isinstance(value, str) else value

    @field_validator("vram")
    @classmethod
    def _vram(cls, value: str | None) -> str | None:
        if value is None or value == "nvml" or value.startswith(("http://", "https://")):
            return value
        if value.strip().lower() == "sim":
            raise ValueError("'sim' is no longer a VRAM source: point vram at the simulator's GPU exporter, like "
                             "any exporter URL: vram = \"http://127.0.0.1:11434/sim/metrics\" (kvgate sim's address)")
        parse_size(value)
        return value

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return _server_root(value)

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: SecretStr | None) -> SecretStr | None:
        return usable_key(value)

    @field_validator("gguf_path")
    @classmethod
    def _gguf_file(cls, value: Path | None) -> Path | None:
        return existing_file(value)

    @model_validator(mode="after")
    def _one_authorization(self) -> BackendSettings:
        if self.api_key is not None and URL(self.url).password is not None:
            raise ValueError("the url's password and api_key both set the backend's Authorization header (Basic "
                             "and Bearer); keep one")
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, mask_url(value) if name == "url" and isinstance(value, str) else value  # never a password

    @property
    def shown_url(self) -> str:
        """The url as kvgate shows it (start-up line, status, errors, logs): its password masked."""
        return mask_url(self.url)


class FirstBackendSettings(Strict):
    """The first backend's settings, over those of the file: how a container is pointed at its server from the
    environment (``KVGATE_BACKEND__URL=http://ollama:11434``) and kept in step with it (``KVGATE_BACKEND__PARALLEL``
    from the same variable as ``OLLAMA_NUM_PARALLEL``). Each one set replaces that field of ``backends[0]``."""

    url: str | None = Field(default=None, description="the first backend's url (in a container, never 127.0.0.1: "
                            "that is the container itself)")
    kind: BackendKind | None = Field(default=None, description="the first backend's kind")
    parallel: int | None = Field(default=None, ge=1, le=256, description="the first backend's parallel")
    context_tokens: int | None = Field(default=None, ge=256, description="the first backend's context_tokens")
    vram: str | None = Field(default=None, description="the first backend's vram source")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return None if value is None else _server_root(value)
