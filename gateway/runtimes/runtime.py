"""The questions a backend's kind answers, asked in one place: the ``Runtime`` each kind of server implements.

After TGI's ``Backend`` trait (router/src/infer/mod.rs): the request path holds a runtime and asks it; it never asks
which kind of server it talks to. The answers, grouped as the request meets them:

    listing and names   list_path, model_names, ollama_tags, serves_one_model, needs_listed_model, pool_model
    probing, pools      pool_source (where a pool's layout comes from), unadmitted_reason, profile, probe_loads_model
    capacity            lists_loaded_models (sizes, contexts and CPU shares of what is loaded: slots, calibration)
    reload rules        reloads_on_num_ctx, runs_at_default_context, cuts_silently, the sequence rules
                        (completions_run, ignored_n_note, reserves_kv)
    counter chain       counter_chain, reads_server_template, calibrates_estimates
    loads               gates_loads, empty_request_loads

Every answer but ``profile`` (one probe) is pure: data and functions of their arguments, no I/O, no clock. And
light: importing a runtime loads no aiohttp or asyncio (the pure planner asks ``reloads_on_num_ctx``), so the
mechanisms a runtime drives (listings, probes, counters, all I/O) are imported inside the methods that use them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.domain import NO_OUTPUT_OPERATIONS, BackendKind, Operation, ParsedRequest

if TYPE_CHECKING:
    from gateway.backends.client import BackendClient
    from gateway.backends.probes import BackendProbes
    from gateway.backends.registry import Backend
    from gateway.memory.profile import ModelProfile
    from gateway.memory.sources.ollama_answers import LoadedModel
    from gateway.tokens.backend_tokenize import TokenizeEndpoints
    from gateway.tokens.chain import CounterChain
    from gateway.tokens.factory import CountingSettings


class PoolSource(StrEnum):
    """Where the layout of a backend's KV pool comes from (admission/kv_pools.py)."""

    LOADED_MODEL = "loaded_model"
    """One pool per model, as the server shows it loaded (Ollama's /api/ps; a model not loaded is loaded first)."""
    SERVER_PROPS = "server_props"
    """One pool per server, from its /props (per-slot context, slots)."""
    CONFIGURED = "configured"
    """One pool per server, from configuration (``parallel``, ``context_tokens``, ``unified_kv``)."""


@dataclass(frozen=True, slots=True)
class SequenceRule:
    """``honours_n``: the backend runs ``n`` completions per prompt (else one, whatever ``n`` says);
    ``embeddings_hold_kv``: its embedding and rerank inputs hold slots and KV cells while they run."""

    honours_n: bool
    embeddings_hold_kv: bool
    why: str


class SlotUse(NamedTuple):
    """One busy slot: the prompt it holds and the tokens it generated so far."""

    prompt_tokens: int
    output_tokens: int


class Runtime(ABC):
    """One kind of backend server: what it does that the gateway must know (module docstring). Subclasses set the
    class attributes and implement the abstract methods; the defaults are those of a plain OpenAI-compatible server."""

    kind: BackendKind
    list_path = "/v1/models"
    serves_one_model = False
    needs_listed_model = False
    pool_source = PoolSource.CONFIGURED
    probe_loads_model = False
    """Probing a pool loads its model (so routing only looks at resident models' pools)."""
    lists_loaded_models = False
    reloads_on_num_ctx = False
    """A request's ``num_ctx`` other than the loaded one reloads the model (the planner pins or follows it)."""
    cuts_silently = False
    """A prompt past the context is cut without a word (answered 200), rather than refused with the server's 400."""
    reads_server_template = False
    calibrates_estimates = False
    """The counter chain learns from the prompt sizes the server reports (its tokenizer is read, not asked)."""
    gates_loads = False
    empty_request_loads = False
    slot_use_path: str | None = None
    """Where the server says what each slot holds right now (llama-server's ``/slots``): a reply that is not streamed
    can then have an elastic reservation, followed there (``admission/slot_watch.py``). None: it can't."""
    sequences: SequenceRule

    def slots_in_use(self, answer: Any) -> list[SlotUse]:
        """The busy slots in the server's answer at ``slot_use_path``: each one's prompt and output tokens."""
        return []

    def model_names(self, listing: dict[str, Any]) -> frozenset[str]:
        """Every name a client may use for the models in a listing."""
        from gateway.backends.models import listed_names

        return listed_names(listing)

    def ollama_tags(self, listing: dict[str, Any]) -> list[dict[str, Any]]:
        """Entries for ``/api/tags`` from the server's own listing."""
        from gateway.backends.models import as_ollama_tags

        return as_ollama_tags(listing)

    def pool_model(self, model: str | None) -> str:
        """The model part of a pool's key for a request that runs ``model`` (the backend's own name for it)."""
        return "" if self.pool_source is not PoolSource.LOADED_MODEL else (model or "")

    def unadmitted_reason(self, backend: Backend) -> str | None:
        """Why ``backend`` is forwarded without admission, or None when kvgate admits its requests."""
        return None

    def runs_at_default_context(self, parsed: ParsedRequest) -> bool:
        """Whether ``parsed`` runs at the server's default context whatever its model was loaded with: it carries no
        context (every /v1 request to Ollama; a native one that sends no num_ctx), so a model loaded at another one
        reloads (the proxy reloads it at the default first, through the GPU check)."""
        return self.reloads_on_num_ctx and parsed.num_ctx_field is None

    def completions_run(self, asked: int) -> int:
        """How many completions of each prompt the backend runs when ``n`` is ``asked``."""
        return asked if self.sequences.honours_n else 1

    def ignored_n_note(self, asked: int) -> tuple[str, ...]:
        """The note an outcome carries when the backend ignores the ``n`` a client sent (forwarded unchanged)."""
        if asked <= 1 or self.sequences.honours_n:
            return ()
        return (f"n={asked} forwarded unchanged; {self.sequences.why}: reserved one sequence",)

    def reserves_kv(self, operation: Operation) -> bool:
        """Whether a request of ``operation`` reserves KV in its pool (every generation does; embeddings and
        reranking where the backend's inputs hold KV cells)."""
        return operation not in NO_OUTPUT_OPERATIONS or self.sequences.embeddings_hold_kv

    async def unconfigured_profile(self, client: BackendClient,
                                   model: str) -> tuple[ModelProfile, list[LoadedModel] | None]:
        """The model's profile, asked of a server known only by its URL (``kvgate estimate --url``), and, where it
        lists its loaded models, those (None: it doesn't, or the list can't be read)."""
        raise LookupError(f"a {self.kind} server reports no model metadata; name a preset or a GGUF file instead")

    @abstractmethod
    async def profile(self, probes: BackendProbes, backend: Backend, model: str) -> ModelProfile:
        """The model's profile as the server runs it; raises ProbeError or LookupError when it can't tell."""

    @abstractmethod
    def counter_chain(self, model: str, *, client: BackendClient, settings: CountingSettings,
                      llama_server_template: str | None = None,
                      endpoints: TokenizeEndpoints | None = None) -> CounterChain:
        """The chain that counts ``model``'s tokens on this server, asking the server through ``client`` first where it
        can count (tokens/factory.py assembles it)."""
