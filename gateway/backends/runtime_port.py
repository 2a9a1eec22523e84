"""What the packages below ``gateway.runtimes`` (backends, tokens, loads) ask of a backend's runtime.

The runtimes (``gateway/runtimes/``) sit above these packages, so these may not import them; each ``Backend`` carries
its runtime instead, through this Protocol, wired where the backends are built (the registry, from the
``runtime_for`` the app passes). The answers are about the backend's server, never its kind: a module here asks
"does it list its loaded models?", not "is it Ollama?".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gateway.domain import BackendKind

if TYPE_CHECKING:
    from gateway.backends.probes import BackendProbes
    from gateway.backends.registry import Backend
    from gateway.memory.profile import ModelProfile


class BackendRuntime(Protocol):
    """The questions backends, tokens and loads ask; ``gateway.runtimes.Runtime`` answers them and more."""

    @property
    def kind(self) -> BackendKind: ...

    @property
    def list_path(self) -> str:
        """Where the server lists its models (``GET``)."""
        ...

    @property
    def serves_one_model(self) -> bool:
        """It runs its one model whatever a request names: one pool per server, the model name ignored."""
        ...

    @property
    def needs_listed_model(self) -> bool:
        """A model it does not list is not served (404), so made-up names never reach it or make pools."""
        ...

    @property
    def lists_loaded_models(self) -> bool:
        """It says which models it holds loaded, their sizes and contexts (Ollama's /api/ps)."""
        ...

    @property
    def gates_loads(self) -> bool:
        """Its model loads go through kvgate's GPU check (it loads models on demand)."""
        ...

    @property
    def empty_request_loads(self) -> bool:
        """A chat or generate with nothing to run loads (or, with keep_alive 0, unloads) the model."""
        ...

    @property
    def reads_server_template(self) -> bool:
        """Its /props carries the chat template the server renders chats with."""
        ...

    def model_names(self, listing: dict[str, Any]) -> frozenset[str]:
        """Every name a client may use for the models in a listing."""
        ...

    def ollama_tags(self, listing: dict[str, Any]) -> list[dict[str, Any]]:
        """Entries for ``/api/tags`` from the server's own listing."""
        ...

    async def profile(self, probes: BackendProbes, backend: Backend, model: str) -> ModelProfile:
        """The model's profile as the server runs it; raises ProbeError or LookupError when it can't tell."""
        ...
