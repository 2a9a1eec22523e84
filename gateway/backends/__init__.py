"""The servers behind the gateway: which models each serves, and where a request goes; the one HTTP call they share
(client.py), which the exporter VRAM source reads its URL with too (vram_exporter.py)."""

from typing import TYPE_CHECKING

from gateway.support.lazy import export

if TYPE_CHECKING:  # at run time each name is imported on first use (gateway/support/lazy.py)
    from gateway.backends.client import BackendCallError, BackendClient
    from gateway.backends.registry import Backend, BackendRegistry

_EXPORTS = {
    "Backend": "gateway.backends.registry",
    "BackendCallError": "gateway.backends.client",
    "BackendClient": "gateway.backends.client",
    "BackendRegistry": "gateway.backends.registry",
}


def __getattr__(name: str) -> object:
    return export(__name__, _EXPORTS, name)


__all__ = ["Backend", "BackendCallError", "BackendClient", "BackendRegistry"]
