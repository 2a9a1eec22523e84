"""Settings: built once at start-up from a TOML file, then ``KVGATE_*`` environment variables, then CLI flags.

Later sources win. Nested settings use ``__`` in environment variables (``KVGATE_SERVER__PORT=8080``); lists are
JSON (``KVGATE_BACKENDS='[{"name": "gpu0", "kind": "ollama", "url": "http://127.0.0.1:11434"}]'``). Nothing reads
the environment after start-up. An invalid setting raises :class:`ConfigError` naming the setting, the value and what
is allowed.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ByteSize,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)
from yarl import URL

from gateway.config_base import _Strict
from gateway.config_fitting import FittingOverrides, FittingSettings
from gateway.config_residency import ResidencyConfig
from gateway.config_routing import RoutingConfig
from gateway.config_shared import SharedLedgerConfig
from gateway.domain import BackendKind
from gateway.memory.kv import CacheType, parse_cache_type
from gateway.memory.vram import parse_size

DEFAULT_PORT = 11435
"""kvgate listens next to Ollama's 11434 by default, so clients change one digit."""

DEFAULT_BACKEND_URL = "http://127.0.0.1:11434"
_TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SHA256_HEX = re.compile(r"[0-9A-Fa-f]{64}")
ANONYMOUS_TENANT = "anonymous"
"""``[tenants.anonymous]``: the policy of requests without a key (and, if it allows them, with an unknown one)."""


class ConfigError(Exception):
    """Raised when a setting is invalid; the message names the setting, the value and what is allowed."""


def _usable_key(value: SecretStr | None) -> SecretStr | None:
    """A key that is empty or whitespace (an unset template variable) would open what it guards, and one with
    surrounding whitespace (a newline from a key file) can never be presented: both are refused."""
    if value is None:
        return None
    secret = value.get_secret_value()
    if not secret.strip():
        raise ValueError("must not be empty or only whitespace (an unset variable?); set a key or remove the setting")
    if secret != secret.strip():
        raise ValueError("must not begin or end with whitespace (a newline from a key file?); no client can send it")
    return value


def _server_root(value: str) -> str:
    url = URL(value)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("must be an http:// or https:// URL with a host, like http://127.0.0.1:11434")
    if url.path not in ("", "/") or url.query_string or url.fragment:
        raise ValueError("must be the server's root, with no path, query or fragment (kvgate appends each "
                         "request's own path), like http://127.0.0.1:11434")
    return str(url).rstrip("/")


def _existing_file(value: Path | None) -> Path | None:
    if value is not None and not value.expanduser().is_file():
        raise ValueError(f"no such file: {value}; fix the path or remove the setting")
    return value




class Timeouts(_Strict):
    """How long to wait for a backend, in seconds."""

    connect_s: float = Field(default=5.0, gt=0)
    first_byte_s: float = Field(
        default=600.0, gt=0, description="until response headers; covers model loads and queues"
    )
    idle_s: float = Field(default=300.0, gt=0, description="between two chunks of a response")


class BackendSettings(_Strict):
    """One LLM server behind the gateway."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: BackendKind = BackendKind.OLLAMA
    url: str = DEFAULT_BACKEND_URL
    api_key: SecretStr | None = None
    timeouts: Timeouts = Timeouts()
    parallel: int | None = Field(
        default=None, ge=1, le=256, description="sequences per model: OLLAMA_NUM_PARALLEL or llama-server -np"
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
        return _usable_key(value)

    @field_validator("gguf_path")
    @classmethod
    def _gguf_file(cls, value: Path | None) -> Path | None:
        return _existing_file(value)


class FirstBackendOverrides(_Strict):
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


class ServerSettings(_Strict):
    """Where kvgate listens and what it accepts."""

    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    max_body_bytes: ByteSize = Field(default=ByteSize(32 * 1024 * 1024), gt=0)
    max_held_body_bytes: ByteSize = Field(
        default=ByteSize(128 * 1024 * 1024), gt=0,
        description="request-body bytes held at once across all requests; more waits held_body_wait_s, then 503",
    )
    held_body_wait_s: float = Field(
        default=2.0, ge=0, description="how long a body waits for room under max_held_body_bytes before a 503",
    )
    require_api_key: bool = Field(default=False, description="refuse requests without a tenant's API key")
    admin_key: SecretStr | None = Field(
        default=None, description="bearer key for /kvgate/status, /kvgate/metrics and (admin_only_management) model "
        "management; unset: loopback clients only"
    )
    admin_only_management: bool = Field(
        default=True, description="model management (/api/pull, push, create, copy, delete, blobs) needs the admin "
        "key, or a loopback client when none is set; false: open to every client (and tenant)"
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"
    log_contents: bool = Field(
        default=False, description="UNSAFE: each request's log line also carries its last user message (escaped, "
        "cut to 200 characters); prompts may hold secrets and personal data. Keys are never logged",
    )
    stream_coalesce_s: float = Field(
        default=0.001, ge=0, le=0.1,
        description="while a stream arrives faster than this, its chunks are written to the client together, at "
        "most once per interval; a chunk after a quieter gap goes out at once; 0 writes each read as it comes",
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0,
        description="a connection whose request headers are not complete this long after it opened (or after the "
        "first byte of a keep-alive request) is closed; clients send headers in one packet, slowloris doesn't",
    )
    body_timeout_s: float = Field(
        default=60.0, gt=0,
        description="a body kvgate reads whole must arrive within this after its headers (408 otherwise; 32 MiB "
        "needs ~0.5 MB/s); a body streamed through (/api/blobs) may take longer but not pause this long",
    )
    client_write_timeout_s: float = Field(
        default=60.0, gt=0,
        description="a response write that can't drain this long (the client stopped reading) ends the response "
        "and releases its reservation; reported as the client's fault, not the backend's",
    )
    keepalive_timeout_s: float = Field(
        default=75.0, gt=0, description="an idle keep-alive connection is closed after this; above the idle "
        "timeouts of common client pools, so a client doesn't reuse a connection kvgate is closing",
    )
    max_connections: int | None = Field(
        default=None, ge=1,
        description="open client connections at most; at the cap a new one closes the one longest waiting for its "
        "headers (or idle), else it gets 503; unset: half the open-file limit, less a reserve of 64",
    )

    @field_validator("admin_key")
    @classmethod
    def _admin_key(cls, value: SecretStr | None) -> SecretStr | None:
        return _usable_key(value)


class ModelSettings(_Strict):
    """What kvgate should know about one model that its backend can't tell it."""

    gguf_path: Path | None = Field(default=None, description="the model's GGUF file, for its exact tokenizer")
    tokenizer_json: Path | None = Field(default=None, description="a Hugging Face tokenizer.json for the model")
    chat_template: str | None = Field(default=None, description="template family: llama3.1, llama3 or chatml")
    image_tokens: int | None = Field(default=None, ge=0, description="tokens one image costs (Ollama: 768)")
    pin: bool = Field(default=False, description="Ollama: never unload this model to make room for another")
    priority: int = Field(
        default=0, description="Ollama: a model is unloaded for another only if its priority is not higher",
    )
    fitting: FittingOverrides = FittingOverrides()

    @field_validator("gguf_path", "tokenizer_json")
    @classmethod
    def _file(cls, value: Path | None) -> Path | None:
        return _existing_file(value)


class CountingConfig(_Strict):
    """How prompts are counted (see gateway/tokens): the backend's own tokenizer wherever it can be had."""

    cache_dir: Path = Field(default=Path("~/.cache/kvgate/tokenizers"), description="converted tokenizers")
    tiktoken_encoding: str | None = Field(default=None, description="e.g. o200k_base; needs tiktoken_dir")
    tiktoken_dir: Path | None = Field(default=None, description="directory of pre-fetched tiktoken files")
    estimate_bytes_per_token: float = Field(default=3.0, gt=0)
    estimate_safety_margin: float = Field(default=0.10, ge=0, le=1)
    default_image_tokens: int = Field(default=768, ge=0)
    count_budget_s: float = Field(
        default=0.25, gt=0, description="a count slower than this (a tokenizer loading) is estimated meanwhile"
    )
    refusal_count_wait_s: float = Field(
        default=60.0, gt=0, description="before refusing or trimming on an estimate, wait this long for the real count"
    )
    exact_count_max_bytes: ByteSize = Field(
        default=ByteSize(4 * 1024 * 1024), ge=0,
        description="a prompt over this many UTF-8 bytes is estimated (flagged), never run through a tokenizer",
    )


class TenantSettings(_Strict):
    """A team or a client: its API keys and its caps. Requests carry a key as ``Authorization: Bearer`` or
    ``X-Api-Key``. ``[tenants.anonymous]`` (no keys) is the policy of requests without a key."""

    api_keys: tuple[SecretStr, ...] = ()
    api_key_sha256: tuple[SecretStr, ...] = Field(
        default=(), description="keys stored hashed: each key's sha256 as 64 hex digits (printf %s KEY | sha256sum)",
    )
    max_active: int | None = Field(default=None, ge=1, description="sequences at once, per model")
    max_pool_share: int | float | None = Field(
        default=None, description="tokens its sequences may hold at once in each model's KV pool, on top of "
        "max_active: a fraction of the pool (a float in (0, 1], e.g. 0.25) or a number of tokens (an integer >= 1); "
        "more waits, and one request that alone needs more is refused (400)",
    )
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(
        default=None, ge=1, description="prompt + output tokens per minute (output settled from the reported "
        "usage); over it: 429 with Retry-After",
    )
    requests_per_minute: int | None = Field(default=None, ge=1, description="over it: 429 with Retry-After")
    priority: int = Field(default=0, description="higher is served first from the queue")
    weight: float = Field(
        default=1.0, gt=0, le=1000, description="within one priority, the queue serves tenants' reserved tokens in "
        "proportion to their weights (admission.queue_order = \"fair\"): 2 gets twice the tokens of 1 when both wait",
    )
    allow_unknown_keys: bool = Field(
        default=False, description="[tenants.anonymous] only: a key no tenant has runs as anonymous instead of a 401",
    )
    fitting: FittingOverrides = FittingOverrides()

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for index, key in enumerate(value):
            try:
                _usable_key(key)
            except ValueError as exc:
                raise ValueError(f"key {index + 1} of {len(value)} {exc}") from None
        return value

    @field_validator("max_pool_share", mode="before")
    @classmethod
    def _pool_share(cls, value: object) -> object:
        fraction = isinstance(value, float) and 0.0 < value <= 1.0
        tokens = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if value is not None and not (fraction or tokens):
            raise ValueError(f"is {value!r}; give a fraction of the pool in (0, 1] such as 0.25, or a number of "
                             "tokens (an integer, at least 1)")
        return value

    @field_validator("api_key_sha256")
    @classmethod
    def _digests(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for index, digest in enumerate(value):
            if not _SHA256_HEX.fullmatch(digest.get_secret_value()):
                raise ValueError(f"digest {index + 1} of {len(value)} is not 64 hex digits; store a key's sha256, "
                                 "made with: printf %s \"$KEY\" | sha256sum (the digits before the '-')")
        return tuple(SecretStr(digest.get_secret_value().lower()) for digest in value)

    def digests(self) -> list[str]:
        """Every key of this tenant as a lowercase sha256 hex digest: its plain keys hashed, then its stored ones."""
        return [sha256_hex(key.get_secret_value()) for key in self.api_keys] + [
            digest.get_secret_value() for digest in self.api_key_sha256
        ]


def sha256_hex(key: str) -> str:
    """The digest ``api_key_sha256`` stores for a key: sha256 of its UTF-8 bytes, lowercase hex."""
    return hashlib.sha256(key.encode()).hexdigest()


class AdmissionConfig(_Strict):
    """What kvgate does before forwarding (gateway/admission): reserve KV, pin num_ctx, clamp, queue or refuse."""

    enabled: bool = True
    default_output_tokens: int = Field(default=1024, ge=1, description="reserved when a client sets no limit")
    estimate_margin: float = Field(default=0.10, ge=0, le=1, description="extra share reserved for estimated counts")
    pin_num_ctx: bool = True
    clamp_output: bool = True
    on_too_long: Literal["trim", "reject"] = Field(
        default="trim", description="a chat too long for the context: drop its oldest history, or refuse it"
    )
    max_queue: int = Field(default=256, ge=0)
    queue_timeout_s: float = Field(default=120.0, gt=0)
    per_tenant_max_active: int | None = Field(default=None, ge=1)
    overtake_window_s: float = Field(default=5.0, ge=0)
    queue_order: Literal["fair", "arrival"] = Field(
        default="fair", description="within one priority: 'fair' shares reserved tokens between tenants by their "
        "weight (one tenant's flood does not hold the others back); 'arrival' is first come, first served",
    )
    pool_refresh_s: float = Field(default=5.0, gt=0, description="how long a backend's slot layout is reused")
    probe_wait_s: float = Field(
        default=10.0, gt=0, description="how long requests wait for a backend's KV layout before a 503"
    )
    default_context_tokens: int = Field(default=4096, ge=256, description="Ollama context when nothing says")
    max_auto_context_tokens: int = Field(
        default=32768, ge=256, description="Ollama: the largest context kvgate picks itself from free VRAM"
    )


class Settings(BaseSettings):
    """All of kvgate's configuration."""

    model_config = SettingsConfigDict(
        env_prefix="KVGATE_", env_nested_delimiter="__", extra="forbid", frozen=True, toml_file=None
    )

    server: ServerSettings = ServerSettings()
    backends: tuple[BackendSettings, ...] = (BackendSettings(name="ollama"),)
    backend: FirstBackendOverrides = Field(
        default=FirstBackendOverrides(), description="overrides of the first backend's url, kind, parallel, "
        "context_tokens and vram, for the environment (KVGATE_BACKEND__URL)",
    )
    default_backend: str | None = Field(default=None, description="name of the backend for unrouted paths")
    models_refresh_s: float = Field(default=30.0, gt=0)
    counting: CountingConfig = CountingConfig()
    admission: AdmissionConfig = AdmissionConfig()
    residency: ResidencyConfig = ResidencyConfig()
    routing: RoutingConfig = RoutingConfig()
    fitting: FittingSettings = FittingSettings()
    shared_ledger: SharedLedgerConfig = SharedLedgerConfig()
    tenants: dict[str, TenantSettings] = Field(default_factory=dict, description="API key -> tenant, with caps")
    models: dict[str, ModelSettings] = Field(default_factory=dict, description="per-model settings, by name")

    @model_validator(mode="before")
    @classmethod
    def _first_backend(cls, data: Any) -> Any:
        """``backend.*`` (from ``KVGATE_BACKEND__*``) replaces those fields of the first backend."""
        if not isinstance(data, dict):
            return data
        given = data.get("backend")
        if isinstance(given, BaseModel):
            given = given.model_dump()
        changes = {key: value for key, value in given.items() if value is not None} if isinstance(given, dict) else {}
        backends = data.get("backends", (BackendSettings(name="ollama"),))
        if not changes or not isinstance(backends, list | tuple) or not backends:
            return data
        first = backends[0].model_dump() if isinstance(backends[0], BaseModel) else backends[0]
        if not isinstance(first, dict):
            return data
        return {**data, "backends": [{**first, **changes}, *backends[1:]]}

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if not self.backends:
            raise ValueError("at least one backend is required")
        names = [backend.name for backend in self.backends]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"backend names must be unique; repeated: {', '.join(duplicates)}")
        self._tenants_consistent()
        if self.default_backend is not None and self.default_backend not in names:
            raise ValueError(f"default_backend '{self.default_backend}' is not a backend; known: {', '.join(names)}")
        return self

    def _tenants_consistent(self) -> None:
        digests = [digest for tenant in self.tenants.values() for digest in tenant.digests()]
        if len(digests) != len(set(digests)):
            raise ValueError("an API key belongs to more than one tenant, or is listed twice (plain in api_keys or "
                             "hashed in api_key_sha256); give each tenant its own keys, once")
        bad = sorted(name for name in self.tenants if not _TENANT_NAME.match(name))
        if bad:
            raise ValueError(f"tenant names may use letters, digits, '_', '.', '-'; not: {', '.join(bad)}")
        anonymous = self.tenants.get(ANONYMOUS_TENANT)
        if anonymous is not None and (anonymous.api_keys or anonymous.api_key_sha256):
            raise ValueError("tenants.anonymous is the policy of requests without a kvgate key, so it has no "
                             "api_keys or api_key_sha256; give those keys a tenant of their own")
        lenient = sorted(name for name, tenant in self.tenants.items()
                         if tenant.allow_unknown_keys and name != ANONYMOUS_TENANT)
        if lenient:
            raise ValueError(f"allow_unknown_keys is a setting of tenants.anonymous only; not: {', '.join(lenient)}")
        admin = self.server.admin_key
        if admin is not None and sha256_hex(admin.get_secret_value()) in digests:
            raise ValueError("server.admin_key is also a tenant's API key; give the admin its own key")
        if self.server.require_api_key and not digests:
            raise ValueError("server.require_api_key is true but no tenant has api_keys or api_key_sha256")
        if self.server.require_api_key and anonymous is not None and anonymous.allow_unknown_keys:
            raise ValueError("server.require_api_key = true refuses requests without a tenant's key, but "
                             "tenants.anonymous.allow_unknown_keys = true lets unknown keys in; choose one")

    @property
    def default(self) -> BackendSettings:
        for backend in self.backends:
            if backend.name == self.default_backend:
                return backend
        return self.backends[0]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


def parse_backend_flag(value: str, index: int) -> dict[str, Any]:
    """``--backend URL`` or ``--backend kind=URL`` or ``--backend name:kind=URL``."""
    spec, sep, url = value.partition("=")
    if not sep:
        return {"name": f"backend{index}" if index else "default", "url": value}
    name, _, kind = spec.rpartition(":")
    return {"name": name or (kind if index == 0 else f"{kind}{index}"), "kind": kind, "url": url}


_SECRET_PARTS = frozenset({"admin_key", "api_key", "api_keys", "tenants"})
"""Settings whose values are never echoed in an error, whatever their type (a tenant's table holds its keys)."""


def _shown(error: ErrorDetails) -> str:
    """`` = <value>`` for an error message, or nothing where the value may be a secret: a key setting (of any type),
    an unknown setting (a misspelled key's value), a table or list (it may hold keys), a URL's password."""
    value = error.get("input")
    secret = bool({str(part) for part in error["loc"]} & _SECRET_PARTS)
    if secret or error["type"] == "extra_forbidden" or isinstance(value, dict | list | tuple | SecretStr):
        return ""
    if isinstance(value, str) and error["loc"] and error["loc"][-1] == "url" and "@" in value:
        try:
            url = URL(value)
        except ValueError:
            return ""
        value = str(url.with_password("****")) if url.password else value
    return f" = {value!r}"


def _describe(error: ErrorDetails) -> str:
    location = ".".join(str(part) for part in error["loc"]) or "settings"
    return f"setting '{location}'{_shown(error)} is invalid: {error['msg']}"


TOOLING_VARIABLES = frozenset({"KVGATE_CACHE", "KVGATE_LLAMA_SERVER", "KVGATE_TINY_MODEL_DIR"})
"""``KVGATE_*`` variables that kvgate's scripts and tests read; not settings, and not reported."""


def _setting_variables(model: type[BaseModel], prefix: str) -> tuple[set[str], set[str]]:
    """Every environment variable that names a setting, and the prefixes under which any name is a table's key."""
    names: set[str] = set()
    open_prefixes: set[str] = set()
    for field_name, field in model.model_fields.items():
        name = prefix + field_name.upper()
        names.add(name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            nested, nested_open = _setting_variables(annotation, name + "__")
            names |= nested
            open_prefixes |= nested_open
        elif typing.get_origin(annotation) is dict:
            open_prefixes.add(name + "__")
    return names, open_prefixes


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """One line for each ``KVGATE_*`` variable that names no setting (kvgate ignores it), with the closest known."""
    names, open_prefixes = _setting_variables(Settings, "KVGATE_")
    lines = []
    for variable in sorted(environ):
        upper = variable.upper()
        if (not upper.startswith("KVGATE_") or upper in names or upper in TOOLING_VARIABLES
                or upper.startswith(tuple(open_prefixes))):
            continue
        close = difflib.get_close_matches(upper[7:], sorted(name[7:] for name in names), n=1, cutoff=0.6)
        hint = f"; did you mean KVGATE_{close[0]}?" if close else "; see config/kvgate.toml for the settings"
        lines.append(f"environment variable {variable} names no kvgate setting{hint}")
    return lines


def load_settings(config_path: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings from a TOML file, the environment and explicit overrides (highest priority)."""
    if config_path is not None and not config_path.is_file():
        raise ConfigError(f"setting '--config' = '{config_path}' is invalid: no such file")

    class _FromFile(Settings):
        model_config = SettingsConfigDict(toml_file=config_path)

    try:
        return Settings.model_validate(_FromFile(**overrides).model_dump())
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(error) for error in exc.errors())) from None
    except SettingsError as exc:  # an environment variable that is not valid JSON; its value is not repeated
        found = re.search(r'field "([^"]+)" from source "EnvSettingsSource"', str(exc))
        if found is None:
            raise ConfigError(f"settings are invalid: {exc}") from None
        variable = "KVGATE_" + found.group(1).upper()
        raise ConfigError(f"setting '{found.group(1)}' from {variable} is invalid: a table or list in an "
                          f"environment variable must be JSON") from None
    except ValueError as exc:  # TOML syntax errors and the like
        raise ConfigError(f"setting '--config' = '{config_path}' is invalid: {exc}") from None
