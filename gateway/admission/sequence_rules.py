"""What each kind of backend runs for a request, in sequences (facts/ollama.md, facts/llama-server.md): each
runtime's ``sequences`` rule (gateway/runtimes/), asked by kind for the cost builder (``admit``) and the proxy.

    kind          n (n_cmpl)                               embeddings and reranking
    ollama        ignored: one sequence, one choice         no KV reservation (an embedding model keeps no KV
                  (/v1 has no n field; the native API       cache, and runs alone: parallel 1); a model not loaded
                  none either)                              is loaded through the GPU check (LoadGate)
    llama-server  n completions per prompt, each its own    one task per input (a rerank: per document), each
                  slot (at most the slots: else its 400)    holding a slot and the KV cells of its tokens
    openai        n per prompt (vLLM, SGLang, ...)          as llama-server's, where the pool is configured

Callers that hold a runtime ask it directly (``runtime.completions_run(n)``); these functions stay for those that
hold a kind.
"""

from __future__ import annotations

from types import MappingProxyType

from gateway.domain import BackendKind, Operation
from gateway.runtimes import SequenceRule, runtime_for

RULES: MappingProxyType[BackendKind, SequenceRule] = MappingProxyType(
    {kind: runtime_for(kind).sequences for kind in BackendKind})


def completions_run(kind: BackendKind, asked: int) -> int:
    """How many completions of each prompt the backend runs when ``n`` is ``asked``."""
    return runtime_for(kind).completions_run(asked)


def ignored_n_note(kind: BackendKind, asked: int) -> tuple[str, ...]:
    """The note an outcome carries when the backend ignores the ``n`` a client sent (forwarded unchanged)."""
    return runtime_for(kind).ignored_n_note(asked)


def reserves_kv(kind: BackendKind, operation: Operation) -> bool:
    """Whether a request of ``operation`` on a backend of ``kind`` reserves KV in its pool (every generation does;
    embeddings and reranking where the backend's inputs hold KV cells)."""
    return runtime_for(kind).reserves_kv(operation)
