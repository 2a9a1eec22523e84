"""What each kind of backend runs for a request, in sequences: the one place that knows it (facts/ollama.md,
facts/llama-server.md).

    kind          n (n_cmpl)                               embeddings and reranking
    ollama        ignored: one sequence, one choice         no KV reservation (an embedding model keeps no KV
                  (/v1 has no n field; the native API       cache, and runs alone: parallel 1); a model not loaded
                  none either)                              is loaded through the GPU check (LoadGate)
    llama-server  n completions per prompt, each its own    one task per input (a rerank: per document), each
                  slot (at most the slots: else its 400)    holding a slot and the KV cells of its tokens
    openai        n per prompt (vLLM, SGLang, ...)          as llama-server's, where the pool is configured

Everything here is data and pure functions: the cost builder (``admit``) and the proxy ask it; nothing else branches
on a backend's kind for these questions.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from gateway.domain import NO_OUTPUT_OPERATIONS, BackendKind, Operation


@dataclass(frozen=True, slots=True)
class SequenceRule:
    """``honours_n``: the backend runs ``n`` completions per prompt (else one, whatever ``n`` says);
    ``embeddings_hold_kv``: its embedding and rerank inputs hold slots and KV cells while they run."""

    honours_n: bool
    embeddings_hold_kv: bool
    why: str


RULES: MappingProxyType[BackendKind, SequenceRule] = MappingProxyType({
    BackendKind.OLLAMA: SequenceRule(
        honours_n=False, embeddings_hold_kv=False,
        why="Ollama runs one sequence whatever n says (it answers one choice)"),
    BackendKind.LLAMA_SERVER: SequenceRule(
        honours_n=True, embeddings_hold_kv=True, why="llama-server runs n completions of each prompt"),
    BackendKind.OPENAI: SequenceRule(
        honours_n=True, embeddings_hold_kv=True, why="OpenAI-compatible servers run n completions of each prompt"),
})


def completions_run(kind: BackendKind, asked: int) -> int:
    """How many completions of each prompt the backend runs when ``n`` is ``asked``."""
    return asked if RULES[kind].honours_n else 1


def ignored_n_note(kind: BackendKind, asked: int) -> tuple[str, ...]:
    """The note an outcome carries when the backend ignores the ``n`` a client sent (forwarded unchanged)."""
    if asked <= 1 or RULES[kind].honours_n:
        return ()
    return (f"n={asked} forwarded unchanged; {RULES[kind].why}: reserved one sequence",)


def reserves_kv(kind: BackendKind, operation: Operation) -> bool:
    """Whether a request of ``operation`` on a backend of ``kind`` reserves KV in its pool (every generation does;
    embeddings and reranking where the backend's inputs hold KV cells)."""
    return operation not in NO_OUTPUT_OPERATIONS or RULES[kind].embeddings_hold_kv
