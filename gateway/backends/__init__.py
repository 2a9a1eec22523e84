"""The servers behind the gateway: which models each serves, and where a request goes."""

from gateway.backends.client import BackendCallError, BackendClient
from gateway.backends.registry import Backend, BackendRegistry

__all__ = ["Backend", "BackendCallError", "BackendClient", "BackendRegistry"]
