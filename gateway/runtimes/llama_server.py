"""llama-server's runtime (facts/llama-server.md): one model per server, its KV layout read from /props.

    listing      /v1/models (with an Ollama-like ``models`` array); it runs its one model whatever a request names,
                 so every llama-server listing the same models shares requests that name none
    pools        one per server: per-slot n_ctx and total_slots from /props; unified unless ``unified_kv = false``
    reloads      none (the context is fixed at start); ``n`` runs n completions, each its own slot; embedding and
                 rerank inputs hold slots and KV cells
    counting     its own /tokenize first (exact), then a configured GGUF rendered with the template /props reports
    loads        not gated (the server loads its model at start)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.domain import BackendKind
from gateway.runtimes.runtime import PoolSource, Runtime, SequenceRule, SlotUse

if TYPE_CHECKING:
    from gateway.backends.client import BackendClient
    from gateway.backends.probes import BackendProbes
    from gateway.backends.registry import Backend
    from gateway.memory.profile import ModelProfile
    from gateway.memory.sources.ollama_answers import LoadedModel
    from gateway.tokens.backend_tokenize import TokenizeEndpoints
    from gateway.tokens.chain import CounterChain
    from gateway.tokens.factory import CountingSettings


class LlamaServerRuntime(Runtime):
    kind = BackendKind.LLAMA_SERVER
    serves_one_model = True
    pool_source = PoolSource.SERVER_PROPS
    reads_server_template = True
    slot_use_path = "/slots"
    sequences = SequenceRule(honours_n=True, embeddings_hold_kv=True,
                             why="llama-server runs n completions of each prompt")

    def slots_in_use(self, answer: Any) -> list[SlotUse]:
        """``GET /slots``: per busy slot, ``n_prompt_tokens`` (the cells it holds, generated ones included) less
        ``next_token.n_decoded`` (a one-element array in the code, an object in the README: both read)."""
        found: list[SlotUse] = []
        for slot in answer if isinstance(answer, list) else ():
            if not isinstance(slot, dict) or slot.get("is_processing") is not True:
                continue
            held, nexts = slot.get("n_prompt_tokens"), slot.get("next_token")
            nxt = nexts[0] if isinstance(nexts, list) and nexts else nexts
            decoded = nxt.get("n_decoded") if isinstance(nxt, dict) else None
            if isinstance(held, int) and isinstance(decoded, int) and 0 <= decoded <= held:
                found.append(SlotUse(held - decoded, decoded))
        return found

    async def profile(self, probes: BackendProbes, backend: Backend, model: str) -> ModelProfile:
        return await probes.llama_server_profile(backend, model)

    async def unconfigured_profile(self, client: BackendClient,
                                   model: str) -> tuple[ModelProfile, list[LoadedModel] | None]:
        from gateway.backends.prober import LlamaServerProber
        from gateway.memory.presets import find_preset, preset_profile

        fallback = preset_profile(model) if find_preset(model) else None
        prober = LlamaServerProber(client, gguf_path=Path(model) if model.endswith(".gguf") else None,
                                   fallback=fallback)
        return await prober.profile(), None

    def counter_chain(self, model: str, *, client: BackendClient, settings: CountingSettings,
                      llama_server_template: str | None = None,
                      endpoints: TokenizeEndpoints | None = None) -> CounterChain:
        from gateway.tokens.factory import build_counter_chain
        from gateway.tokens.llama_server_counter import LlamaServerCounter

        return build_counter_chain(model, settings=settings, served=(LlamaServerCounter(client, model=model),),
                                   llama_server_template=llama_server_template)
