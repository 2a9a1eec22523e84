"""Settings: built once at start-up from a TOML file, then ``KVGATE_*`` environment variables, then CLI flags.

Later sources win. Nested settings use ``__`` in environment variables (``KVGATE_SERVER__PORT=8080``); lists are
JSON (``KVGATE_BACKENDS='[{"name": "gpu0", "kind": "ollama", "url": "http://127.0.0.1:11434"}]'``). Nothing reads
the environment after start-up. An invalid setting raises :class:`ConfigError` naming the setting, the value and what
is allowed.
"""

from __future__ import annotations

import difflib
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

from gateway.config.admission import AdmissionSettings
from gateway.config.backends import (
    DEFAULT_BACKEND_URL,
    BackendSettings,
    FirstBackendSettings,
    TimeoutSettings,
    existing_file,
)
from gateway.config.base import Strict, usable_key
from gateway.config.files import ConfigPaths, config_paths, overlaps
from gateway.config.fitting import FittingOverrideSettings, FittingSettings
from gateway.config.residency import ResidencySettings
from gateway.config.routing import RoutingSettings
from gateway.config.shared_ledger import SharedLedgerSettings
from gateway.config.tenants import ANONYMOUS_TENANT, TenantSettings, sha256_hex
from gateway.support.redact import mask_url

__all__ = [  # the tenants' and admission's settings live in their own modules; these names are kvgate's settings API
    "ANONYMOUS_TENANT",
    "DEFAULT_BACKEND_URL",
    "AdmissionSettings",
    "BackendSettings",
    "ConfigError",
    "FirstBackendSettings",
    "Settings",
    "TenantSettings",
    "TimeoutSettings",
    "load_settings",
    "sha256_hex",
]

DEFAULT_PORT = 11435
"""kvgate listens next to Ollama's 11434 by default, so clients change one digit."""

MAX_WORKERS = 64
"""``server.workers`` at most: past the cores of any host kvgate runs on, each worker is one more Redis client."""

_TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ConfigError(Exception):
    """Raised when a setting is invalid; the message names the setting, the value and what is allowed."""


class ServerSettings(Strict):
    """Where kvgate listens and what it accepts."""

    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    workers: int = Field(
        default=1, ge=1, le=MAX_WORKERS, description="processes serving on the port (SO_REUSEPORT), kept by a "
        "supervisor that restarts one that dies; above 1 needs shared_ledger.redis_url (one KV budget for all)",
    )
    allow_reload_to_drop_security: bool = Field(
        default=False, description="a reload (SIGHUP, POST /kvgate/reload) whose file removes every tenant's key or "
        "the admin key, turns require_api_key off or lets unknown keys in, is refused (a SECURITY warning) unless "
        "the new file sets this true; a file that sets nothing (only whitespace and comments) is always refused on "
        "reload",
    )
    watch_config_s: float = Field(
        default=0.0, ge=0, le=3600, description="how often kvgate serve reads its --config files (through symlinks) "
        "and reloads when one changed, as on SIGHUP; 0: never (reload with SIGHUP or POST /kvgate/reload). For a "
        "mounted Kubernetes ConfigMap or Secret, which the kubelet updates in place",
    )
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
        default=True, description="model management (/api/pull, push, create, copy, delete, blobs; llama-server's POST "
        "/slots/{id}, /props, /lora-adapters, /models/load, /models/unload) needs the admin key, or a loopback client "
        "when none is set; false: open to every client (and tenant)"
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
    min_body_bytes_per_s: float = Field(
        default=1024.0, ge=0,
        description="a request body slower than this on average, once body_grace_s has passed, gets 408 (a body kvgate "
        "reads) or its connection closed (one streamed through); at max_connections the slowest body is closed to "
        "make room; 0: no minimum rate",
    )
    body_grace_s: float = Field(
        default=10.0, gt=0, description="how long a request body may arrive slower than min_body_bytes_per_s",
    )
    max_connections_per_peer: int | None = Field(
        default=None, ge=1,
        description="open connections from one client address at most; beyond it a request gets 429 and its "
        "connection is closed (and such connections are the first closed at max_connections); unset: half of "
        "max_connections (behind a reverse proxy every client is one address: raise it)",
    )
    max_json_elements: int = Field(
        default=1_000_000, ge=1,
        description="a JSON body kvgate reads with more '[', '{' and ',' bytes than this (counted before parsing, "
        "strings included) is refused with 413: bytes bounded, what parsing them builds is bounded too",
    )

    @field_validator("admin_key")
    @classmethod
    def _admin_key(cls, value: SecretStr | None) -> SecretStr | None:
        return usable_key(value)


class ModelSettings(Strict):
    """What kvgate should know about one model that its backend can't tell it."""

    gguf_path: Path | None = Field(default=None, description="the model's GGUF file, for its exact tokenizer")
    tokenizer_json: Path | None = Field(default=None, description="a Hugging Face tokenizer.json for the model")
    chat_template: str | None = Field(default=None, description="template family: llama3.1, llama3 or chatml")
    image_tokens: int | None = Field(default=None, ge=0, description="tokens one image costs (Ollama: 768)")
    pin: bool = Field(default=False, description="Ollama: never unload this model to make room for another")
    priority: int = Field(
        default=0, description="Ollama: a model is unloaded for another only if its priority is not higher",
    )
    fitting: FittingOverrideSettings = FittingOverrideSettings()

    @field_validator("gguf_path", "tokenizer_json")
    @classmethod
    def _file(cls, value: Path | None) -> Path | None:
        return existing_file(value)


class CountingSettings(Strict):
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
    max_tokenizing_bytes: ByteSize = Field(
        default=ByteSize(8 * 1024 * 1024), gt=0,
        description="prompt bytes being tokenized at once, all requests together; a count that finds no room "
        "within its count budget is estimated (flagged)",
    )


class Settings(BaseSettings):
    """All of kvgate's configuration."""

    model_config = SettingsConfigDict(
        env_prefix="KVGATE_", env_nested_delimiter="__", extra="forbid", frozen=True, toml_file=None
    )

    server: ServerSettings = ServerSettings()
    backends: tuple[BackendSettings, ...] = (BackendSettings(name="ollama"),)
    backend: FirstBackendSettings = Field(
        default=FirstBackendSettings(), description="overrides of the first backend's url, kind, parallel, "
        "context_tokens and vram, for the environment (KVGATE_BACKEND__URL)",
    )
    default_backend: str | None = Field(default=None, description="name of the backend for unrouted paths")
    models_refresh_s: float = Field(default=30.0, gt=0)
    counting: CountingSettings = CountingSettings()
    admission: AdmissionSettings = AdmissionSettings()
    residency: ResidencySettings = ResidencySettings()
    routing: RoutingSettings = RoutingSettings()
    fitting: FittingSettings = FittingSettings()
    shared_ledger: SharedLedgerSettings = SharedLedgerSettings()
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
        self._workers_consistent()
        if self.default_backend is not None and self.default_backend not in names:
            raise ValueError(f"default_backend '{self.default_backend}' is not a backend; known: {', '.join(names)}")
        return self

    def _workers_consistent(self) -> None:
        workers, ledger = self.server.workers, self.shared_ledger
        if workers > 1 and ledger.redis_url is None:
            raise ValueError(f"server.workers = {workers} needs shared_ledger.redis_url: each worker's own ledger "
                             f"would admit the whole KV pool {workers} times over; set [shared_ledger] redis_url (a "
                             f"local Redis will do) or run one worker")
        if workers > ledger.replicas and ledger.on_unreachable == "local_share":
            raise ValueError(f"shared_ledger.replicas = {ledger.replicas} is below server.workers = {workers}: "
                             f"with Redis unreachable each worker admits into 1/replicas of every pool; count "
                             f"every worker of every replica in shared_ledger.replicas")

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
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, deep_merge=True))


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
    an unknown setting (a misspelled key's value), a table or list (it may hold keys); a URL's password masked."""
    value = error.get("input")
    secret = bool({str(part) for part in error["loc"]} & _SECRET_PARTS)
    if secret or error["type"] == "extra_forbidden" or isinstance(value, dict | list | tuple | SecretStr):
        return ""
    if isinstance(value, str):
        value = mask_url(value)  # a backend's url, the redis_url: parsed or not, the password never shows
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


def load_settings(config_path: ConfigPaths = None, **overrides: Any) -> Settings:
    """Build the settings from one or several TOML files (merged table by table, config/files.py), the environment
    and explicit overrides (highest priority)."""
    paths = config_paths(config_path)
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"setting '--config' = '{path}' is invalid: no such file")
    overlap = overlaps(paths) if len(paths) > 1 else None
    if overlap is not None:
        raise ConfigError(f"setting '--config' is invalid: {overlap}")
    shown = ", ".join(f"'{path}'" for path in paths)

    class _FromFile(Settings):
        model_config = SettingsConfigDict(toml_file=list(paths) or None)

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
        raise ConfigError(f"setting '--config' = {shown} is invalid: {exc}") from None
