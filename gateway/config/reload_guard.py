"""What a reload may not do by accident: drop kvgate's protection, or apply an empty file.

A reload replaces the tenants, the admin key and ``require_api_key`` live (gateway/config/reload.py). A file truncated
by an editor as it saves, a deploy that wrote nothing, or someone who can write the file but not restart kvgate would
open it to every client. So a reload is refused, and the running settings stay, when

    the file is empty             nothing but whitespace and comments (:func:`refusing_empty_file`; ``--config``)
    every tenant key goes         the running settings have a tenant's key, the new ones none
    the admin key goes            ``server.admin_key`` set, then unset (a rotated key is fine)
    require_api_key goes          ``server.require_api_key`` from true to false
    unknown keys let in           ``tenants.anonymous.allow_unknown_keys`` from false to true while tenants have keys

unless the new settings say ``server.allow_reload_to_drop_security = true`` (then it applies, with a SECURITY
warning). The check compares settings (pure, :func:`security_drops`); it names settings, never a key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path

from gateway.config.files import ConfigPaths, config_paths
from gateway.config.settings import ConfigError, Settings
from gateway.config.tenants import ANONYMOUS_TENANT

ALLOW_SETTING = "server.allow_reload_to_drop_security"


def _tenant_keys(settings: Settings) -> int:
    return sum(len(tenant.digests()) for tenant in settings.tenants.values())


def _lets_unknown_keys_in(settings: Settings) -> bool:
    anonymous = settings.tenants.get(ANONYMOUS_TENANT)
    return anonymous is not None and anonymous.allow_unknown_keys


def security_drops(running: Settings, loaded: Settings) -> tuple[str, ...]:
    """What of the running protection ``loaded`` would remove, one phrase each; () when it removes none."""
    drops = []
    if _tenant_keys(running) and not _tenant_keys(loaded):
        drops.append("remove every tenant's API key")
    if running.server.admin_key is not None and loaded.server.admin_key is None:
        drops.append("remove server.admin_key")
    if running.server.require_api_key and not loaded.server.require_api_key:
        drops.append("turn server.require_api_key from true to false")
    if _tenant_keys(running) and not _lets_unknown_keys_in(running) and _lets_unknown_keys_in(loaded):
        drops.append("let unknown keys in as anonymous (tenants.anonymous.allow_unknown_keys = true)")
    return tuple(drops)


def refusal_message(drops: tuple[str, ...]) -> str:
    """Why a reload that ``drops`` protection was refused, and how to apply it anyway."""
    return (f"the new configuration would {' and '.join(drops)}, opening kvgate to clients it refuses now; if that "
            f"is intended, say so in the file with {ALLOW_SETTING} = true (or restart kvgate with it)")


def is_empty_toml(text: str) -> bool:
    """Whether ``text`` sets nothing: empty, or only whitespace and comments. Invalid TOML is not empty (the
    loader names its error)."""
    try:
        return not tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False


def refusing_empty_file(config: ConfigPaths, source: Callable[[], Settings]) -> Callable[[], Settings]:
    """``source`` for a reload: it raises ConfigError (``--config``) when one of the files sets nothing, since a
    file that empty is a half-written one far more often than an intent to drop every setting."""
    paths = config_paths(config)

    def load() -> Settings:
        for path in paths:
            if _sets_nothing(path):
                raise ConfigError(f"setting '--config' = '{path}' is invalid: the file is empty (or only whitespace "
                                  "and comments); a reload never applies an empty file (was it being written?); "
                                  "restart kvgate to run on the defaults")
        return source()

    return load


def _sets_nothing(path: Path) -> bool:
    return path.is_file() and is_empty_toml(path.read_text(encoding="utf-8", errors="replace"))
