"""What the gateway knows about each backend: model profiles (KV bytes per token, weights, context) and live VRAM.

One prober and one VRAM source per backend, built lazily and kept, so their caches (profiles by digest or file,
VRAM readings by refresh period) last for the life of the app.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from gateway.backends import Backend
from gateway.backends.load_times import LoadTimes, reported_load_s
from gateway.backends.model_names import same_model
from gateway.backends.prober import LlamaServerProber, OllamaProber, ProbeError
from gateway.backends.vram_exporter import ExporterSource
from gateway.memory.presets import find_preset, preset_profile
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.gguf_file import profile_from_gguf
from gateway.memory.sources.llama_server_answers import ServerProps
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.memory.vram import CachedVramSource, StaticVramSource, VramReading, VramSource
from gateway.memory.vram_nvml import nvml_source


class BackendProbes:
    def __init__(self, session: aiohttp.ClientSession, vram_sources: dict[str, VramSource] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._session = session
        self._clock = clock
        self.load_times = LoadTimes()
        """How long the loads kvgate asked for took, per backend and model (routing weighs a load with them)."""
        self._ollama: dict[str, OllamaProber] = {}
        self._llama: dict[str, LlamaServerProber] = {}
        self._vram: dict[str, VramSource] = dict(vram_sources or {})
        self._listed: dict[str, tuple[str, ...]] = {}
        self._on_cpu: dict[str, dict[str, float]] = {}
        """Per Ollama backend: the share on the CPU of each model its last /api/ps listed (1 - size_vram/size)."""

    async def aclose(self) -> None:
        """End every probe in flight (at shutdown, before the session closes)."""
        for prober in [*self._ollama.values(), *self._llama.values()]:
            await prober.aclose()

    async def profile(self, backend: Backend, model: str) -> ModelProfile:
        """The model's profile as the backend serves it (its runtime says how it is probed); raises ProbeError when
        the backend can't tell, LookupError when nothing describes the model."""
        return await backend.runtime.profile(self, backend, model)

    async def ollama_profile(self, backend: Backend, model: str) -> ModelProfile:
        """Ollama: the model's profile from /api/show (cached by digest)."""
        return await self._ollama_prober(backend).profile(model)

    async def llama_server_profile(self, backend: Backend, model: str) -> ModelProfile:
        """llama-server: the served model's profile from /props and its GGUF, else ``model`` as a preset or path."""
        return await self._llama_prober(backend).profile(fallback=local_profile(model) if model else None)

    def _llama_prober(self, backend: Backend) -> LlamaServerProber:
        llama = self._llama.get(backend.name)
        if llama is None:
            settings = backend.settings
            llama = LlamaServerProber(
                backend.client, gguf_path=settings.gguf_path, configured_unified=settings.unified_kv,
                configured_parallel=settings.parallel,
            )
            self._llama[backend.name] = llama
        return llama

    async def llama_props(self, backend: Backend) -> ServerProps:
        """llama-server's /props (per-slot context, slots, model file): all a token pool needs, no GGUF."""
        return await self._llama_prober(backend).props()

    def _ollama_prober(self, backend: Backend) -> OllamaProber:
        ollama = self._ollama.get(backend.name)
        if ollama is None:
            ollama = self._ollama[backend.name] = OllamaProber(backend.client)
        return ollama

    async def load_model(self, backend: Backend, model: str, num_ctx: int | None, *, embedding: bool = False) -> None:
        """Ollama: load the model (an empty /api/generate; an embedding model: an empty /api/embed), at ``num_ctx``
        or at Ollama's own default; how long it took goes into ``load_times``: Ollama's own ``load_duration``, at
        most the request's own time on kvgate's clock (the clock service times are measured with; a simulator running
        faster than real time reports its own seconds), the request's time when the answer has none."""
        started_s = self._clock()
        answer = await self._ollama_prober(backend).load(model, num_ctx, embedding=embedding)
        waited_s = self._clock() - started_s
        reported_s = reported_load_s(answer)
        self.load_times.record(backend.name, model, waited_s if reported_s is None else min(reported_s, waited_s))

    async def ollama_version(self, backend: Backend) -> str | None:
        """Ollama: its version (/api/version, read once); None when it can't be had now."""
        try:
            return await self._ollama_prober(backend).version()
        except ProbeError:
            return None

    async def unload_model(self, backend: Backend, model: str) -> None:
        """Ollama: unload the model (keep_alive 0)."""
        await self._ollama_prober(backend).unload(model)

    async def loaded_models(self, backend: Backend, *, join_running: bool = False) -> list[LoadedModel]:
        """Ollama: every model /api/ps shows loaded now; with ``join_running`` a read in flight will do."""
        loaded = await self._ollama_prober(backend).loaded(join_running=join_running)
        self._listed[backend.name] = tuple(model.name for model in loaded)
        self._on_cpu[backend.name] = {model.name: model.offloaded_fraction for model in loaded}
        return loaded

    def on_cpu(self, backend: str, model: str) -> float | None:
        """Ollama: the share of ``model`` on the CPU as the last /api/ps showed it; None when it did not list it."""
        shares = self._on_cpu.get(backend, {})
        return next((share for name, share in shares.items() if same_model(name, model)), None)

    def partly_on_cpu(self, backend: str) -> str | None:
        """Ollama: a model the last /api/ps showed partly on the CPU (the backend offloads), None if none."""
        return next((name for name, share in self._on_cpu.get(backend, {}).items() if share > 0), None)

    def last_loaded(self, backend: str) -> tuple[str, ...] | None:
        """Ollama: the models the last /api/ps kvgate read from ``backend`` listed (any read, for any purpose: a
        pool probe, a load decision, the status page); None before the first. No I/O."""
        return self._listed.get(backend)

    async def loaded_model(
        self, backend: Backend, model: str, *, join_running: bool = True
    ) -> LoadedModel | None:
        """Ollama: the model as /api/ps shows it loaded now (size, size_vram, context), None when not loaded; with
        ``join_running`` a read in flight will do (a burst of /kvgate/fit requests reads /api/ps once)."""
        return next((loaded for loaded in await self.loaded_models(backend, join_running=join_running)
                     if same_model(loaded.name, model)), None)

    async def loaded_context(self, backend: Backend, model: str) -> int | None:
        """Ollama: the per-sequence context the model is loaded with now (/api/ps read anew: it follows loads and
        reloads), None when not loaded."""
        loaded = await self.loaded_model(backend, model, join_running=False)
        return None if loaded is None else loaded.context_tokens

    def vram_source(self, backend: Backend) -> VramSource | None:
        """The backend's configured VRAM source (``vram`` setting), cached for ``vram_refresh_s``."""
        settings = backend.settings
        if backend.name in self._vram:
            return self._vram[backend.name]
        if settings.vram is None:
            return None
        inner: VramSource
        if settings.vram == "nvml":
            inner = nvml_source()
        elif settings.vram.startswith(("http://", "https://")):
            inner = ExporterSource(self._session, settings.vram)
        else:
            inner = StaticVramSource.from_text(settings.vram)
        source = CachedVramSource(inner, refresh_s=settings.vram_refresh_s)
        self._vram[backend.name] = source
        return source

    async def vram(self, backend: Backend, *, taken_after_s: float | None = None) -> VramReading | None:
        """The backend's VRAM reading (None without a ``vram`` setting); with ``taken_after_s``, one taken since."""
        source = self.vram_source(backend)
        if source is None:
            return None
        if isinstance(source, CachedVramSource):
            return await source.read(taken_after_s=taken_after_s)
        return await source.read()


def local_profile(model: str) -> ModelProfile | None:
    """A preset by name, or a GGUF file by path; None for anything else."""
    if find_preset(model):
        return preset_profile(model)
    if model.endswith(".gguf") and Path(model).is_file():
        return profile_from_gguf(model)
    return None
