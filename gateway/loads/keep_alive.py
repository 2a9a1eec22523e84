"""A client's ``keep_alive`` on Ollama's native routes (pure): ``0`` unloads the model for every client the moment
its request ends, a negative one pins it for good; both are the operator's to decide, not one client's.

    residency.client_keep_alive   keep_alive 0 / negative, without the admin key      other values, or the admin key
    "strip" (the default)         removed from the body (the backend's own default    forwarded as sent
                                  applies), said in X-Kvgate-Keep-Alive
    "refuse"                      400 naming the setting and the value                forwarded as sent
    "allow"                       forwarded as sent (kvgate before issue 23)          forwarded as sent

Only a request carrying ``server.admin_key`` (as ``Authorization: Bearer``) counts as the admin's here; with no admin
key set, nobody's is. ``keep_alive`` is a number of seconds or a duration: ``"0"``, ``"0s"``, ``"-1m"``,
``"1h30m"``, as Ollama reads it (a string it can't read is left for it to refuse).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from gateway.config.residency import ClientKeepAlive
from gateway.errors import BadRequest

HEADER = "X-Kvgate-Keep-Alive"
_DURATION = re.compile(r"([+-]?)((?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+")
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h)")


@dataclass(frozen=True, slots=True)
class KeepAliveVerdict:
    """The body to forward (None: as it came) and the header that says what was done (None: nothing)."""

    body: dict[str, Any] | None = None
    note: str | None = None


AS_SENT = KeepAliveVerdict()


def sign_of(value: object) -> int | None:
    """-1, 0 or 1 for a keep_alive that is negative (forever), zero (unload now) or positive; None when unreadable."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            if not _DURATION.fullmatch(text):
                return None
            magnitude = sum(float(part) for part in _PART.findall(text))
            return 0 if magnitude == 0 else -1 if text.startswith("-") else 1
    return 0 if value == 0 else -1 if value < 0 else 1


def describe(value: object) -> str:
    return f"{value!r}" if isinstance(value, str) else f"{value}"


def client_keep_alive(body: dict[str, Any], mode: ClientKeepAlive, *, admin: bool) -> KeepAliveVerdict:
    """What becomes of the body's ``keep_alive`` (module docstring); raises BadRequest under "refuse"."""
    if "keep_alive" not in body or admin or mode == "allow":
        return AS_SENT
    value = body["keep_alive"]
    sign = sign_of(value)
    if sign is None or sign > 0:
        return AS_SENT
    what = "unloads the model for every client as soon as this request ends" if sign == 0 else \
        "keeps the model loaded for good, whatever else needs the GPU"
    if mode == "refuse":
        raise BadRequest(f"keep_alive {describe(value)} {what}; kvgate refuses it from clients "
                         "(residency.client_keep_alive = \"refuse\"): leave keep_alive out, or send kvgate's admin key")
    stripped = {name: item for name, item in body.items() if name != "keep_alive"}
    return KeepAliveVerdict(stripped, f"stripped keep_alive {describe(value)} (residency.client_keep_alive = "
                                      "strip: only kvgate's admin key may unload or pin a model)")


def carries_admin_key(headers: Mapping[str, str], admin_key: SecretStr | None) -> bool:
    """Whether the request carries ``server.admin_key`` as ``Authorization: Bearer`` (constant time); never with
    no admin key set."""
    if admin_key is None:
        return False
    given = headers.get("Authorization", "").removeprefix("Bearer ").encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, admin_key.get_secret_value().encode())


def unloads(body: dict[str, Any]) -> bool:
    """Whether the body's keep_alive unloads the model (0) once its request ends."""
    return "keep_alive" in body and sign_of(body["keep_alive"]) == 0
