"""kvgate's configuration files: one or several (``--config A --config B``), read as one, and watched for changes.

Several files let a deployment keep what it reviews apart from what it keeps secret: the backends and policy in one
file (a Kubernetes ConfigMap), the tenants' API keys in another (a Secret). They are merged table by table, in the
order given, so a tenant's caps may sit in the first file and its keys in the second; a setting (not a table) given
in two files is an error naming the setting and both files, never a silent winner, and never its value.

``fingerprint`` is what ``server.watch_config_s`` compares (gateway/cli/config_watch.py): the files' contents, read
through symlinks, so the atomic ``..data`` swap a kubelet makes when a ConfigMap or Secret changes is seen.

Pure but for reading the files.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ConfigPaths = Path | Sequence[Path] | None
"""What ``--config`` gives: none, one file, or several (in order)."""


def config_paths(config: ConfigPaths) -> tuple[Path, ...]:
    if config is None:
        return ()
    return (config,) if isinstance(config, Path) else tuple(config)


def overlaps(paths: Sequence[Path]) -> str | None:
    """Why these files can't be read as one (a setting in two of them, the first found), or None. A file that is
    not TOML is left to the loader, which names its error."""
    seen: dict[str, Path] = {}
    for path in paths:
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        for name in _settings(document):
            first = seen.setdefault(name, path)
            if first != path:
                return f"setting '{name}' is in both '{first}' and '{path}'; keep it in one"
    return None


def _settings(document: Mapping[str, Any], where: str = "") -> list[str]:
    """The dotted names of every setting (not a table) in ``document``."""
    names: list[str] = []
    for key, value in document.items():
        name = f"{where}.{key}" if where else key
        names.extend(_settings(value, name) if isinstance(value, dict) else [name])
    return names


def fingerprint(paths: Sequence[Path]) -> tuple[str, ...] | None:
    """The files' contents, as digests (through symlinks); None while one of them can't be read (a swap midway)."""
    digests = []
    for path in paths:
        try:
            digests.append(hashlib.sha256(path.read_bytes()).hexdigest())
        except OSError:
            return None
    return tuple(digests)
