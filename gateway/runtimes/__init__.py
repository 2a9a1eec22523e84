"""One runtime per kind of backend server: the one place that knows what Ollama, llama-server and an
OpenAI-compatible server do differently (after TGI's ``Backend`` trait; design.md section 4).

    runtime.py        Runtime: the questions (listing and names, probing and the pool layout, capacity, the reload
                      rules, the counter chain, load behaviour), with an OpenAI-compatible server's defaults
    ollama.py         OllamaRuntime          (a dialect and a runtime of the same backend share its name)
    llama_server.py   LlamaServerRuntime
    openai_compat.py  OpenAICompatRuntime

``runtime_for(kind_or_backend)`` gives the kind's runtime; callers ask it instead of branching on the kind.

Where it sits, and why the packages below reach it through a Protocol. A runtime is made of the mechanisms of the
packages below it (probers and listings in ``backends``, counters in ``tokens``, load facts in ``memory``), so it
sits above them: support < config < memory < backends < tokens < dialects < fitting < loads < runtimes < admission
< routing < observability < edge, api, cli. The packages above (admission, routing, api, cli, the proxy) import it
and ask ``runtime_for``. The packages below ask it too (the registry which names a model, the load gate whether a
load is gated, the counters which chain to build), and may not import it: each ``Backend`` carries its runtime as a
``gateway.backends.runtime_port.BackendRuntime`` (the questions they ask, about the server, never its kind), wired
where the registry builds the backends, and the prompt counter is handed ``runtime_for`` for its chains. A newcomer
adding a kind writes one module here and one line in ``_RUNTIMES``; nothing below branches on a kind.

Runtimes hold no state: one instance per kind, shared. Importing them is light (no aiohttp, no asyncio: the pure
planner asks them; runtime.py says how).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from gateway.domain import BackendKind
from gateway.runtimes.llama_server import LlamaServerRuntime
from gateway.runtimes.ollama import OllamaRuntime
from gateway.runtimes.openai_compat import OpenAICompatRuntime
from gateway.runtimes.runtime import PoolSource, Runtime, SequenceRule, SlotUse

if TYPE_CHECKING:
    from gateway.backends.registry import Backend

_RUNTIMES: dict[BackendKind, Runtime] = {
    BackendKind.OLLAMA: OllamaRuntime(),
    BackendKind.LLAMA_SERVER: LlamaServerRuntime(),
    BackendKind.OPENAI: OpenAICompatRuntime(),
}
_RUNTIME_TYPES = frozenset(type(runtime) for runtime in _RUNTIMES.values())


def runtime_for(kind_or_backend: BackendKind | Backend) -> Runtime:
    """The runtime of a kind of backend, or the one a backend carries (the one its registry wired: its kind's, or
    whatever a test gave it), so the packages above and below ask one runtime per backend."""
    if type(kind_or_backend) is BackendKind:  # exact types first: this runs several times a request, and an ABC's
        return _RUNTIMES[kind_or_backend]      # isinstance costs a call of its own
    backend = cast("Backend", kind_or_backend)
    carried = backend.runtime
    if type(carried) in _RUNTIME_TYPES or isinstance(carried, Runtime):
        return cast(Runtime, carried)
    return _RUNTIMES[backend.kind]


__all__ = ["PoolSource", "Runtime", "SequenceRule", "SlotUse", "runtime_for"]
