"""The runtime of an OpenAI-compatible server (vLLM, SGLang, a hosted API): it reports no KV layout.

    listing      /v1/models; the model named as given
    pools        one per server, from configuration (``parallel``, ``context_tokens``, ``unified_kv``); without them
                 the backend is forwarded without admission, and says so
    reloads      none; ``n`` runs n completions; embedding inputs hold KV as llama-server's
    counting     the server's tokenize endpoint where it has one (probed once for all its models), then local files
    loads        not gated
    profile      a preset by name or a GGUF path: the server reports no model metadata
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.domain import BackendKind
from gateway.runtimes.runtime import PoolSource, Runtime, SequenceRule

if TYPE_CHECKING:
    from gateway.backends.client import BackendClient
    from gateway.backends.probes import BackendProbes
    from gateway.backends.registry import Backend
    from gateway.memory.profile import ModelProfile
    from gateway.tokens.backend_tokenize import TokenizeEndpoints
    from gateway.tokens.chain import CounterChain
    from gateway.tokens.factory import CountingSettings


class OpenAICompatRuntime(Runtime):
    kind = BackendKind.OPENAI
    pool_source = PoolSource.CONFIGURED
    sequences = SequenceRule(honours_n=True, embeddings_hold_kv=True,
                             why="OpenAI-compatible servers run n completions of each prompt")

    def unadmitted_reason(self, backend: Backend) -> str | None:
        settings = backend.settings
        if settings.parallel is None or settings.context_tokens is None:
            return (f"{backend.describe()} is an OpenAI-compatible server that reports no KV layout; it is forwarded "
                    "without admission (set its parallel and context_tokens, and unified_kv, to admit its requests)")
        return None

    async def profile(self, probes: BackendProbes, backend: Backend, model: str) -> ModelProfile:
        from gateway.backends.probes import local_profile

        profile = local_profile(model)
        if profile is None:
            raise LookupError(f"{backend.describe()} is an OpenAI-style server that reports no model metadata, "
                              f"and {model!r} is not a preset or a GGUF path")
        return profile

    def counter_chain(self, model: str, *, client: BackendClient, settings: CountingSettings,
                      llama_server_template: str | None = None,
                      endpoints: TokenizeEndpoints | None = None) -> CounterChain:
        from gateway.tokens.backend_tokenize import BackendTokenizeCounter, TokenizeEndpoints
        from gateway.tokens.factory import build_counter_chain

        counter = BackendTokenizeCounter(endpoints or TokenizeEndpoints(client), model=model or None)
        return build_counter_chain(model, settings=settings, served=(counter,),
                                   llama_server_template=llama_server_template)
