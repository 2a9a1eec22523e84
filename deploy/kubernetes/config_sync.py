"""Keep a kvgate pod's configuration file in step with its ConfigMap and Secret, and reload kvgate when it changes.

kvgate reads one TOML file, at start-up and on a reload (SIGHUP or ``POST /kvgate/reload``); it does not watch it.
In Kubernetes its settings come from two places: the ConfigMap ``kvgate-config`` (``kvgate.toml``: backends,
policy, tenants' caps; reviewable, no secrets) and the Secret ``kvgate-secrets`` (``tenants.toml``: the tenants'
``api_keys`` or ``api_key_sha256``). The kubelet updates both mounts in place, by swapping a ``..data`` symlink,
usually within a minute or two of a change. This script runs twice in each pod (deploy/kubernetes/deployment.yaml):

    once   the init container: merge the two files into one (:func:`render`), written with an atomic rename into
           the pod's in-memory emptyDir that ``kvgate serve --config`` reads; an error stops the pod from starting
           (Init:Error), naming the setting, never a value
    watch  the sidecar: every ``--interval-s`` render again (reading through the symlinks, so a swap is seen);
           when the result differs from the file kvgate runs with, replace it and ``POST /kvgate/reload`` with the
           admin key over 127.0.0.1. kvgate validates the new file: a refused one keeps the running settings (and
           fires KvgateConfigReloadRefused). A file that can't be merged is not written: kvgate keeps its settings
           and this log says why (once per distinct error). A reload kvgate did not take in (not listening yet,
           restarting, a 5xx or 429 answer) is sent again next round.

The merge is table by table: a tenant's caps may sit in the ConfigMap and its keys in the Secret. A setting given
in both files is an error rather than a silent winner, and the tenants file may hold only ``[tenants.*]``. The
merged document is written back as TOML (:func:`dumps`) and parsed again before it is used: what kvgate reads is
exactly the merge, or nothing is written.

Stdlib only: it runs on the kvgate image's Python, mounted from the ConfigMap ``kvgate-config-sync``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

ADMIN_KEY_VARIABLE = "KVGATE_SERVER__ADMIN_KEY"
"""The admin key, from the Secret: the same variable kvgate itself reads."""
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


class MergeError(ValueError):
    """Raised when the two files can't make one configuration: a file that is not TOML, a setting in both, a
    tenants file holding more than ``[tenants.*]``. The message names files and settings, never a value."""


def merge(base: Mapping[str, Any], extra: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """``base`` with ``extra``'s tables merged in; a setting (not a table) in both is a :class:`MergeError`."""
    merged = dict(base)
    for key, value in extra.items():
        name = f"{where}.{key}" if where else key
        if key not in merged:
            merged[key] = value
        elif isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = merge(merged[key], value, name)
        else:
            raise MergeError(f"setting '{name}' is in both files; keep it in one")
    return merged


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(value: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped (TOML allows no others raw)."""
    parts = [_TOML_ESCAPES.get(char) or (f"\\u{ord(char):04x}" if char < " " or char == "\x7f" else char)
             for char in value]
    return '"' + "".join(parts) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(key)} = {_value(item)}" for key, item in value.items()) + "}"
    raise MergeError(f"a {type(value).__name__} value can't be written back (kvgate's settings have none)")


def _tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _write_table(path: tuple[str, ...], table: Mapping[str, Any], lines: list[str], header: str) -> None:
    if path:
        lines.append(header.format(".".join(_key(part) for part in path)))
    for key, value in table.items():
        if not isinstance(value, dict) and not _tables(value):
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in table.items():
        if isinstance(value, dict):
            _write_table((*path, key), value, lines, "[{}]")
        elif _tables(value):
            for item in value:
                _write_table((*path, key), item, lines, "[[{}]]")


def dumps(document: Mapping[str, Any]) -> str:
    """``document`` as TOML (tables as ``[a.b]``, lists of tables as ``[[a]]``), checked by parsing it again."""
    lines: list[str] = []
    _write_table((), document, lines, "")
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != document:
        raise MergeError("the merged configuration did not survive being written as TOML; nothing was written")
    return text


def _parse(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:  # line and column only: a tenants file's keys are not repeated
        raise MergeError(f"{path} is not valid TOML: {exc}") from None


def render(config: Path, tenants: Path) -> str:
    """The file kvgate runs with: ``config`` (the ConfigMap's) merged with ``tenants`` (the Secret's)."""
    secret = _parse(tenants)
    others = sorted(key for key in secret if key != "tenants")
    if others:
        raise MergeError(f"{tenants} may hold only [tenants.*] tables; move {', '.join(others)} to {config}")
    header = (f"# Written by config_sync.py from {config} and {tenants} (the ConfigMap kvgate-config and the Secret\n"
              f"# kvgate-secrets): edit those, not this file.\n")
    return header + dumps(merge(_parse(config), secret))


def write_if_changed(path: Path, text: str) -> bool:
    """Replace ``path`` with ``text`` in one rename (readable by this user only: it holds keys); False: unchanged."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except FileNotFoundError:
        pass
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return True


RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Answers that say "not now" (kvgate at its connection cap, shutting down), not "this file is wrong"."""


def post_reload(url: str, admin_key: str, timeout_s: float) -> bool:
    """``POST /kvgate/reload``; True once kvgate answered for the file (applied, or refused: final either way, and
    logged here), False when it could not be reached or answered "not now" (try again)."""
    if not url.startswith("http://127.0.0.1:"):  # the admin key goes to this pod's kvgate and nowhere else
        raise ValueError(f"--reload-url {url} is not http://127.0.0.1:<port>/...")
    request = urllib.request.Request(url, method="POST", headers={"Authorization": f"Bearer {admin_key}"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (http, checked above)
            _log(f"kvgate reloaded: {response.read().decode('utf-8', 'replace')}")
    except urllib.error.HTTPError as exc:
        retried = exc.code in RETRIED_STATUSES
        _log(f"kvgate {'did not take' if retried else 'refused'} the reload ({exc.code}): "
             f"{exc.read().decode('utf-8', 'replace')}" + ("; retrying" if retried else ""))
        return not retried
    except (urllib.error.URLError, OSError) as exc:
        _log(f"kvgate not reached at {url} ({exc}); retrying")
        return False
    return True


def _log(message: str) -> None:
    print(f"config-sync: {message}", file=sys.stderr, flush=True)


def _once(args: argparse.Namespace, last_error: str | None) -> tuple[bool, str | None]:
    """Render and write: whether the file changed, and why it could not be rendered (None: it could). A file that
    can't be rendered is kept as it was; the reason is logged when it is not the last round's."""
    try:
        text = render(args.config, args.tenants)
    except (MergeError, OSError) as exc:
        if str(exc) != last_error:
            _log(f"not updated, kvgate keeps its settings: {exc}")
        return False, str(exc)
    changed = write_if_changed(args.output, text)
    if changed:
        _log(f"wrote {args.output}")
    return changed, None


def watch(args: argparse.Namespace, admin_key: str, rounds: int | None = None) -> None:
    """Keep ``--output`` in step and reload kvgate on each change (``rounds``: stop after that many, for tests)."""
    pending, error, done = False, None, 0
    while rounds is None or done < rounds:
        changed, error = _once(args, error)
        pending = changed or pending
        if pending:
            pending = not post_reload(args.reload_url, admin_key, args.timeout_s)
        done += 1
        if rounds is None or done < rounds:
            time.sleep(args.interval_s)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="config_sync.py", description=__doc__.split("\n", 1)[0])
    parser.add_argument("mode", choices=("once", "watch"))
    parser.add_argument("--config", type=Path, required=True, help="the ConfigMap's kvgate.toml")
    parser.add_argument("--tenants", type=Path, required=True, help="the Secret's tenants.toml")
    parser.add_argument("--output", type=Path, required=True, help="the file kvgate serve --config reads")
    parser.add_argument("--reload-url", default="http://127.0.0.1:11435/kvgate/reload")
    parser.add_argument("--interval-s", type=float, default=5.0)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode == "once":
        try:
            write_if_changed(args.output, render(args.config, args.tenants))
        except (MergeError, OSError) as exc:
            _log(str(exc))
            return 2
        return 0
    admin_key = os.environ.get(ADMIN_KEY_VARIABLE, "")
    if not admin_key.strip():
        _log(f"{ADMIN_KEY_VARIABLE} is not set: POST /kvgate/reload needs the admin key")
        return 2
    # The container's PID 1: a signal without a handler would be ignored, and the pod would wait out its grace period
    signal.signal(signal.SIGTERM, _stop)
    watch(args, admin_key)
    return 0


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    sys.exit(main())
