"""Ollama's runtime (facts/ollama.md): models listed at /api/tags and loaded on demand, one pool per loaded model.

    listing      /api/tags; ``x`` and ``x:latest`` name one model; a name it does not list is a 404 (never forwarded)
    pools        split: num_parallel slots of num_ctx tokens per model, as /api/ps shows it loaded; probing a pool
                 loads its model (routing looks only at resident ones)
    reloads      a num_ctx other than the loaded one reloads the model; a /v1 request carries none and runs at
                 Ollama's default context; ``n`` is ignored (one sequence); embeddings hold no KV
    counting     the tokenizer read from /api/show (or a configured GGUF), calibrated on the prompt sizes it reports
    loads        every load goes through the GPU check (LoadGate); an empty chat or generate is a load request
    truncation   a prompt past the context is cut to about half of it, answered 200 (facts/ollama.md 4.6)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.domain import BackendKind
from gateway.runtimes.runtime import PoolSource, Runtime, SequenceRule

if TYPE_CHECKING:
    from gateway.backends.client import BackendClient
    from gateway.backends.probes import BackendProbes
    from gateway.backends.registry import Backend
    from gateway.memory.profile import ModelProfile
    from gateway.memory.sources.ollama_answers import LoadedModel
    from gateway.tokens.backend_tokenize import TokenizeEndpoints
    from gateway.tokens.chain import CounterChain
    from gateway.tokens.count import Counter
    from gateway.tokens.factory import CountingSettings
    from gateway.tokens.message_cache import CountCache


class OllamaRuntime(Runtime):
    kind = BackendKind.OLLAMA
    list_path = "/api/tags"
    needs_listed_model = True
    pool_source = PoolSource.LOADED_MODEL
    probe_loads_model = True
    lists_loaded_models = True
    reloads_on_num_ctx = True
    cuts_silently = True
    calibrates_estimates = True
    gates_loads = True
    empty_request_loads = True
    sequences = SequenceRule(honours_n=False, embeddings_hold_kv=False,
                             why="Ollama runs one sequence whatever n says (it answers one choice)")

    def model_names(self, listing: dict[str, Any]) -> frozenset[str]:
        from gateway.backends.models import listed_names, with_spellings

        return with_spellings(listed_names(listing))

    def ollama_tags(self, listing: dict[str, Any]) -> list[dict[str, Any]]:
        from gateway.backends.models import tags_of_models

        return tags_of_models(listing)

    async def profile(self, probes: BackendProbes, backend: Backend, model: str) -> ModelProfile:
        return await probes.ollama_profile(backend, model)

    async def unconfigured_profile(self, client: BackendClient,
                                   model: str) -> tuple[ModelProfile, list[LoadedModel] | None]:
        from gateway.backends.prober import OllamaProber, ProbeError

        prober = OllamaProber(client)
        profile = await prober.profile(model)
        try:
            return profile, await prober.loaded()
        except ProbeError:
            return profile, None

    def counter_chain(self, model: str, *, client: BackendClient, settings: CountingSettings,
                      llama_server_template: str | None = None,
                      endpoints: TokenizeEndpoints | None = None) -> CounterChain:
        from gateway.tokens.factory import build_counter_chain
        from gateway.tokens.overhead import OverheadEstimator
        from gateway.tokens.sources import OllamaShowSource
        from gateway.tokens.tokenizer_counter import TokenizerCounter

        def read_tokenizer(cache: CountCache, image_tokens: int) -> Counter:
            return TokenizerCounter(OllamaShowSource(client, model, cache_dir=settings.cache_dir), model=model,
                                    template=settings.chat_templates.get(model), overhead=OverheadEstimator(),
                                    image_tokens=image_tokens, cache=cache)

        return build_counter_chain(model, settings=settings, read_tokenizer=read_tokenizer,
                                   llama_server_template=llama_server_template)
