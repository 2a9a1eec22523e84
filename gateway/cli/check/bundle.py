"""``kvgate check --report PATH``: a support bundle (a directory, or a .tar.gz when PATH ends so) with what people
are told to collect when asking for help (troubleshooting.md): the findings, the backend's answers, versions, the
log lines that matched, and kvgate's config. Every secret is scrubbed: SecretStr values are dumped masked, any
field named like a key/token/password/authorization is masked, URL passwords are masked, and finally every known
secret string is replaced wherever it appears (a backend could echo one back)."""

from __future__ import annotations

import io
import platform
import re
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, SecretStr
from yarl import URL

from gateway import __version__
from gateway.config.settings import Settings

MASK = "***scrubbed***"
_SECRET_KEY = re.compile(r"key|token|secret|password|authorization|cookie", re.IGNORECASE)


def secrets_of(settings: Settings) -> set[str]:
    """Every secret string in ``settings``: backend api keys, the admin key, tenants' keys and key digests."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, SecretStr):
            found.add(value.get_secret_value())
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))

    walk(settings)
    for backend in settings.backends:
        password = URL(backend.url).password
        if password:
            found.add(password)
    return {secret for secret in found if secret}


def scrub(value: Any) -> Any:
    """A JSON-able copy with secret-named fields and URL passwords masked."""
    if isinstance(value, dict):
        return {k: (MASK if _SECRET_KEY.search(str(k)) and v not in (None, [], ()) else scrub(v))
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(item) for item in value]
    if isinstance(value, str) and "@" in value and "://" in value:
        try:
            url = URL(value)
        except ValueError:
            return value
        return str(url.with_password(MASK)) if url.password else value
    return value


_BEARER = re.compile(r"(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+")


def scrub_text(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)


def _dumped(value: Any) -> str:
    return orjson.dumps(scrub(value), option=orjson.OPT_INDENT_2, default=str).decode()


def bundle_files(settings: Settings, report: dict[str, Any], answers: dict[str, Any], text: str,
                 log_lines: list[str]) -> dict[str, str]:
    """File name -> contents, scrubbed."""
    secrets = secrets_of(settings)
    files = {
        "findings.json": _dumped(report),
        "findings.txt": text,
        "backend-answers.json": _dumped(answers),
        "versions.json": _dumped({"kvgate": __version__, "python": sys.version, "platform": platform.platform()}),
        "config.json": _dumped(settings.model_dump(mode="json")),
        "matched-log-lines.txt": "\n".join(log_lines),
    }
    return {name: scrub_text(content, secrets) for name, content in files.items()}


def write_bundle(path: Path, files: dict[str, str]) -> Path:
    if path.name.endswith((".tar.gz", ".tgz")):
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w:gz") as archive:
            for name, content in files.items():
                data = content.encode()
                info = tarfile.TarInfo(f"kvgate-check/{name}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        return path
    path.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (path / name).write_text(content, encoding="utf-8")
    return path
