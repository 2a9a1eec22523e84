"""Reload without a restart: ``SIGHUP`` or ``POST /kvgate/reload`` (admin) re-reads the configuration.

    re-read    the sources the process started from: its ``--config`` file, its ``KVGATE_*`` environment and its
               command-line flags (the ``source`` a :class:`Reloader` is given; ``kvgate serve`` passes its own)
    validate   a file that is gone, doesn't parse or fails validation is refused (:class:`ReloadRefused` names the
               setting, as the start-up error does) and nothing changes
    guard      a file that would drop every tenant key, the admin key or require_api_key without saying so
               (``server.allow_reload_to_drop_security``) is refused with a SECURITY warning; so is an empty file
               (gateway/config/reload_guard.py)
    split      the new settings are taken field by field into the running ones where they apply live
               (:func:`effective_settings`); the rest keep their running values
    apply      in one step, between two requests: :class:`LiveSettings` holds the settings and the tenant directory
               built from them, and tells its listeners (the admitter's policy, the rate buckets)
    report     ``changed``: what now applies; ``needs_restart``: what the file says but the process can't take
               without a restart (listed in the answer, a WARNING line and ``/kvgate/status``)

What a reload changes, and what waits for a restart:

    live (new requests)                                  needs a restart
    tenants.* (keys, caps, priority, weight, rates,      server.* other than those at left (listen address,
      pool share, fitting; tenants added or removed)       body and connection limits, timeouts, logging)
    server.admin_key, server.require_api_key,            backends, default_backend, models_refresh_s
      server.allow_reload_to_drop_security
    admission.* that the admitter reads (enabled,        admission.pool_refresh_s, probe_wait_s,
      default_output_tokens, estimate_margin,              default_context_tokens, max_auto_context_tokens
      pin_num_ctx, clamp_output, on_too_long, max_queue,   (the pool directory's, bound at start)
      queue_timeout_s, per_tenant_max_active,            counting.*, residency.* (the counters and the load gate)
      overtake_window_s, queue_order)                    fitting.summary_cache_entries
    fitting.* (the rest)                                 models.NAME.* other than its fitting; models added or
    models.NAME.fitting, for a model already configured    removed

A reload whose file also changes a restart-only setting is not refused: the live part applies (an operator who
edits a tenant's cap and the port in one go gets the cap now) and each restart-only setting is named as needing a
restart, until one happens; every later reload names it again while the file and the process disagree. Names only,
never values: a tenant's table holds its keys.

In-flight requests are untouched: a request keeps the tenant (caps, rates) and the policy it was identified and
admitted with; its reservation stays in the same ledger (a reload never builds a new ``Ledger`` or ``WaitingRoom``)
and is released once, when it ends. A queued request waits under the policy it was queued with. The rate buckets of
tenants that remain keep their levels (``RateLimiter.retain``); a changed rate applies from the next request.

Reloads run one at a time (a lock); reading the file runs off the event loop. A SIGHUP that comes while ``kvgate
serve`` starts is kept and applied once it is ready (gateway/cli/hangups.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from gateway.config.reload_guard import ALLOW_SETTING, refusal_message, security_drops
from gateway.config.settings import ConfigError, Settings
from gateway.errors import InvalidConfig

log = logging.getLogger("gateway.config.reload")

LIVE_SERVER = ("admin_key", "require_api_key", "allow_reload_to_drop_security")
LIVE_ADMISSION = ("enabled", "default_output_tokens", "estimate_margin", "pin_num_ctx", "clamp_output", "on_too_long",
                  "max_queue", "queue_timeout_s", "per_tenant_max_active", "overtake_window_s", "queue_order",
                  "elastic")
"""What ``Admitter.reconfigure`` takes in; the other admission settings are the pool directory's, bound at start."""
RESTART_FITTING = ("summary_cache_entries",)
"""The summary cache is sized once; every other ``[fitting]`` setting is read per request (``policy_for``)."""

SettingsSource = Callable[[], Settings]
Listener = Callable[[Settings], None]
_Model = TypeVar("_Model", bound=BaseModel)
Directory = TypeVar("Directory")
"""The tenant directory's type (``TenantDirectory``: who is asking is admission's, a layer above configuration)."""
_SETTING = re.compile(r"setting '([^']+)'")
"""How a ``ConfigError`` message names the setting (``config._describe`` and ``load_settings``)."""


class ReloadRefused(InvalidConfig):
    """Raised when the configuration can't be re-read or is invalid; nothing was changed. ``param``: the first
    setting named (a dotted name like ``tenants.ci.max_active``, or ``--config`` for the file itself; None for
    settings that are each valid but disagree, which the message names). ``POST /kvgate/reload`` answers it as 400
    ``invalid_config`` (gateway.edge.error_boundary)."""

    @classmethod
    def from_config_error(cls, error: ConfigError) -> ReloadRefused:
        message = str(error)
        found = _SETTING.search(message)
        param = found.group(1) if found else None
        return cls(message, None if param == "settings" else param)  # "settings": settings that disagree together


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """The dotted names of the settings a reload applied, and of those it could not without a restart."""

    changed: tuple[str, ...]
    needs_restart: tuple[str, ...]


class LiveSettings(Generic[Directory]):
    """The settings new requests run under and the tenant directory built from them: the one place the request path
    reads them from. A reload replaces both in one step and tells the listeners (no await between: a request sees
    the old pair or the new, never half of each). ``directory`` builds the tenant directory from settings
    (``TenantDirectory``: who is asking is admission's, a layer above configuration, so it is passed in: the app
    holds a ``LiveSettings[TenantDirectory]``)."""

    def __init__(self, settings: Settings, *, directory: Callable[[Settings], Directory]) -> None:
        self.settings = settings
        self._directory = directory
        self.tenants = directory(settings)
        self.reloaded_at_s: float | None = None
        """Wall-clock time of the last applied reload (None: none since start)."""
        self.needs_restart: tuple[str, ...] = ()
        """What the configuration last read says that only a restart applies."""
        self._listeners: list[Listener] = []

    def __repr__(self) -> str:
        return f"LiveSettings(tenants={self.tenants!r}, reloaded_at_s={self.reloaded_at_s})"

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` with the new settings after each reload (it must not fail: all is validated before)."""
        self._listeners.append(listener)

    def replace(self, settings: Settings, needs_restart: tuple[str, ...] = ()) -> None:
        tenants = self._directory(settings)
        self.settings, self.tenants, self.needs_restart = settings, tenants, needs_restart
        self.reloaded_at_s = time.time()
        for listener in self._listeners:
            listener(settings)


def _take(running: _Model, loaded: _Model, names: tuple[str, ...]) -> _Model:
    return running.model_copy(update={name: getattr(loaded, name) for name in names})


def effective_settings(running: Settings, loaded: Settings) -> Settings:
    """The running settings with every live setting taken from ``loaded`` (see the module's table). Both are
    validated settings, and the live settings that validate together (tenants, the admin key, require_api_key) all
    come from ``loaded``, so the result is as valid as they are."""
    live_fitting = tuple(name for name in type(loaded.fitting).model_fields if name not in RESTART_FITTING)
    models = {name: _take(model, loaded.models[name], ("fitting",)) if name in loaded.models else model
              for name, model in running.models.items()}
    return running.model_copy(update={
        "tenants": dict(loaded.tenants),
        "server": _take(running.server, loaded.server, LIVE_SERVER),
        "admission": _take(running.admission, loaded.admission, LIVE_ADMISSION),
        "fitting": _take(running.fitting, loaded.fitting, live_fitting),
        "models": models,
    })


def _tree(settings: Settings) -> dict[str, Any]:
    """The settings as nested dicts; backends by name, so a change names the backend rather than a list index."""
    tree = settings.model_dump()
    tree["backends"] = {backend["name"]: backend for backend in tree["backends"]}
    return tree


def _differences(old: Any, new: Any, path: tuple[str, ...]) -> Iterator[str]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in [*old, *(key for key in new if key not in old)]:
            if key not in old or key not in new:
                yield ".".join((*path, str(key)))  # a table added or removed: its name, not each of its fields
            else:
                yield from _differences(old[key], new[key], (*path, str(key)))
    elif old != new:  # SecretStr compares its secret: a changed key shows as its setting's name, never its value
        yield ".".join(path)


def changed_settings(old: Settings, new: Settings) -> tuple[str, ...]:
    """The dotted names of the settings that differ: ``tenants.ci.max_active``, ``tenants.new`` (a table added or
    removed), ``backends.gpu0.url``."""
    return tuple(_differences(_tree(old), _tree(new), ()))


def plan_reload(running: Settings, loaded: Settings) -> tuple[Settings, ReloadReport]:
    """The settings to run under from now, and what changed: applied (running -> effective) and waiting for a
    restart (effective -> loaded). Pure."""
    effective = effective_settings(running, loaded)
    return effective, ReloadReport(changed_settings(running, effective), changed_settings(effective, loaded))


class Reloader:
    """Re-read the configuration from ``source`` and apply it to ``live``; one reload at a time. ``on_outcome`` is
    told "ok" or "refused" (the metric)."""

    def __init__(
        self, live: LiveSettings[Any], source: SettingsSource | None,
        on_outcome: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self._live = live
        self._source = source
        self._on_outcome = on_outcome
        self._lock = asyncio.Lock()

    async def reload(self, trigger: str) -> ReloadReport:
        """Apply the configuration as it is now; raises ReloadRefused (nothing changed) when it can't be."""
        async with self._lock:
            try:
                loaded = await self._load()
            except ReloadRefused as exc:
                self._on_outcome("refused")
                log.error("configuration reload (%s) refused, the running settings stay: %s", trigger,
                          exc.message.replace("\n", "; "))
                raise
            self._guard(trigger, loaded)
            effective, report = plan_reload(self._live.settings, loaded)
            self._live.replace(effective, report.needs_restart)
            self._on_outcome("ok")
        log.info("configuration reloaded (%s); changed: %s", trigger, ", ".join(report.changed) or "nothing")
        if report.needs_restart:
            log.warning("configuration reload (%s): these settings need a restart to apply, until then the running "
                        "values stay: %s", trigger, ", ".join(report.needs_restart))
        return report

    def _guard(self, trigger: str, loaded: Settings) -> None:
        """Refuse (ReloadRefused, a SECURITY warning) a reload that drops protection the file doesn't say it
        means to drop (gateway/config/reload_guard.py); one that says so applies, with the same warning."""
        drops = security_drops(self._live.settings, loaded)
        if not drops:
            return
        if loaded.server.allow_reload_to_drop_security:
            log.warning("SECURITY: configuration reload (%s) will %s, as %s = true allows", trigger,
                        " and ".join(drops), ALLOW_SETTING)
            return
        self._on_outcome("refused")
        message = refusal_message(drops)
        log.warning("SECURITY: configuration reload (%s) refused, the running settings stay: %s", trigger, message)
        raise ReloadRefused(message, ALLOW_SETTING)

    async def _load(self) -> Settings:
        if self._source is None:
            raise ReloadRefused("this kvgate was started without a configuration to re-read (kvgate serve has "
                                "one); restart it to change its settings", None)
        try:
            return await asyncio.to_thread(self._source)
        except ConfigError as exc:
            raise ReloadRefused.from_config_error(exc) from None
        except OSError as exc:  # the file exists but can't be read (permissions): start-up would fail the same way
            raise ReloadRefused(f"setting '--config' can't be read: {exc.strerror or exc}", "--config") from None
