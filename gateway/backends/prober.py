"""Fetch model profiles from running backends, cached until the model changes.

Ollama: /api/tags gives each model's digest and size; /api/show is asked only for a digest not seen before, and
again with ``verbose`` only when a per-layer array came back null. llama-server: /props and /v1/models; the GGUF
at ``model_path`` is read (off the event loop) when this host can see it, cached by path and mtime.

Every call goes through the backend's ``BackendClient`` (its key, Host and timeouts); its errors become
ProbeError here, in ``_call``.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.backends.client import BackendCallError, BackendClient
from gateway.backends.model_names import find_model
from gateway.domain import BackendKind
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.common import ProfileError
from gateway.memory.sources.llama_server_answers import (
    ServerProps,
    SlotState,
    check_unified,
    parse_models,
    parse_props,
    parse_slots,
    profile_from_llama_server,
)
from gateway.memory.sources.ollama_answers import (
    LoadedModel,
    TagEntry,
    needs_verbose,
    parse_ps,
    parse_tags,
    profile_from_show,
)
from gateway.support.gguf_reader import GgufSummary, read_gguf
from gateway.support.single_flight import SingleFlight

RECENT_PROBE_S = 2.0
"""A model list or profile read this recently answers a request too: a burst of requests probes once, not once each.
Readings that must follow a change (what /api/ps or /props shows after a load) are asked with no age at all."""


class ProbeError(Exception):
    """Raised when a backend cannot be asked (unreachable, HTTP error, not JSON) or its answer is unusable."""


class ProfileUnderivable(ProbeError):
    """Raised when the backend answered, but no KV profile can be derived from what it said (an architecture or a
    metadata field kvgate doesn't know): asking again won't help."""


class _Prober:
    """Calls through the backend's client; every failed call is a ProbeError."""

    def __init__(self, client: BackendClient, timeout_s: float) -> None:
        self.client = client
        self._timeout_s = timeout_s
        self._shared: SingleFlight[str, Any] = SingleFlight()

    async def aclose(self) -> None:
        """End the probes in flight (at shutdown)."""
        await self._shared.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            return await self.client.request_json(method, path, body, timeout_s=self._timeout_s)
        except BackendCallError as exc:
            raise ProbeError(f"probe failed: {exc.message}") from exc


class OllamaProber(_Prober):
    def __init__(self, client: BackendClient, *, timeout_s: float = 30.0) -> None:
        super().__init__(client, timeout_s)
        self._profiles: dict[str, ModelProfile] = {}
        self._underivable: dict[str, ProfileUnderivable] = {}
        """Models (by digest; without one, by name and size) whose /api/show answered but gave no profile: the same
        model answers the same, so it is not asked again on every pool probe (a model re-pulled has a new digest)."""
        self._showing: SingleFlight[str, ModelProfile] = SingleFlight()
        self._version: str | None = None
        self.show_requests = 0

    async def aclose(self) -> None:
        await super().aclose()
        await self._showing.aclose()

    async def profile(self, model: str) -> ModelProfile:
        """The model's profile: /api/tags read anew (a re-pulled model's new digest counts at once; requests asking
        together share one read), /api/show once per digest, however many requests ask at once."""
        tags_json = await self._shared.run(
            "/api/tags", lambda: self._call("GET", "/api/tags"), join_running=True)
        tags = parse_tags(tags_json)
        listed = find_model(model, tags)
        tag = tags[listed] if listed is not None else None
        if tag is None:
            raise ProbeError(f"Ollama has no model {model!r}; it has: {', '.join(sorted(tags)) or 'none'}")
        key = tag.digest or tag.name
        cached = self._profiles.get(key)
        if cached is not None:
            return cached
        failed = self._underivable.get(_identity(tag))
        if failed is not None:
            raise failed
        return await self._showing.run(key, lambda: self._profile_from_show(key, tag), max_age_s=RECENT_PROBE_S)

    async def _profile_from_show(self, key: str, tag: TagEntry) -> ModelProfile:
        try:
            show = await self._show(tag.name, verbose=False)
            if needs_verbose(show):
                show = await self._show(tag.name, verbose=True)
            profile = profile_from_show(tag.name, show, size_bytes=tag.size_bytes, digest=tag.digest)
        except (ValueError, ProfileError) as exc:
            failed = ProfileUnderivable(f"Ollama model {tag.name}: {exc}")
            self._underivable[_identity(tag)] = failed
            raise failed from exc
        self._profiles[key] = profile
        return profile

    async def _show(self, model: str, *, verbose: bool) -> dict[str, Any]:
        self.show_requests += 1
        show: dict[str, Any] = await self._call("POST", "/api/show", {"model": model, "verbose": verbose})
        return show

    async def load(self, model: str, num_ctx: int | None, *, embedding: bool = False) -> Any:
        """Ollama's load request: /api/generate with no prompt loads the model and answers once it is loaded (with
        its ``load_duration``); an embedding model (which answers /api/generate with 400 "does not support
        generate") loads on an /api/embed with no input."""
        body: dict[str, Any] = {"model": model, "stream": False}
        if embedding:
            body = {"model": model, "input": []}
        if num_ctx is not None:
            body["options"] = {"num_ctx": num_ctx}
        return await self._call("POST", "/api/embed" if embedding else "/api/generate", body)

    async def version(self) -> str | None:
        """/api/version's ``version``, read once (None when the backend does not say, or can't be asked now: asked
        again next time)."""
        if self._version is None:
            try:
                answer = await self._call("GET", "/api/version")
            except ProbeError:
                return None
            found = answer.get("version") if isinstance(answer, dict) else None
            self._version = found if isinstance(found, str) and found else None
        return self._version

    async def unload(self, model: str) -> None:
        """Ollama's unload request (what `ollama stop` sends): keep_alive 0 and no prompt; the model goes now if idle,
        else once its requests finish."""
        await self._call("POST", "/api/generate", {"model": model, "keep_alive": 0, "stream": False})

    async def loaded(self, *, join_running: bool = False) -> list[LoadedModel]:
        """Every model /api/ps shows loaded, read anew; with ``join_running`` a read still in flight will do (requests
        asking together share one), else only reads started since this one was asked (a re-read after a load)."""
        ps = await self._shared.run("/api/ps", lambda: self._call("GET", "/api/ps"), join_running=join_running)
        try:
            return parse_ps(ps)
        except ProfileError as exc:
            raise ProbeError(str(exc)) from exc


class LlamaServerProber(_Prober):
    def __init__(
        self,
        client: BackendClient,
        *,
        gguf_path: Path | None = None,
        fallback: ModelProfile | None = None,
        configured_unified: bool | None = None,
        configured_parallel: int | None = None,
        configured_ctx_size: int | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        super().__init__(client, timeout_s)
        self._gguf_path = gguf_path
        self._fallback = fallback
        self._configured = (configured_unified, configured_parallel, configured_ctx_size)
        self._gguf_cache: dict[tuple[str, int], GgufSummary] = {}

    async def _summary(self, model_path: str) -> GgufSummary | None:
        path = self._gguf_path or (Path(model_path) if model_path else None)
        if path is None:
            return None
        try:
            mtime_ns = path.stat().st_mtime_ns
        except OSError:
            return None  # the server's file is not visible from here
        key = (str(path), mtime_ns)
        if key not in self._gguf_cache:
            self._gguf_cache = {key: await asyncio.to_thread(read_gguf, path)}
        return self._gguf_cache[key]

    async def props(self, *, max_age_s: float = 0.0) -> ServerProps:
        """/props alone: per-slot context, slot count, model file and alias (read anew, or at most ``max_age_s``
        old; reads asked at once share one)."""
        try:
            return parse_props(await self._get("/props", max_age_s))
        except (ProfileError, ValueError) as exc:
            raise ProbeError(f"llama-server at {self.client.label}: {exc}") from exc

    async def _get(self, path: str, max_age_s: float) -> Any:
        return await self._shared.run(path, lambda: self._call("GET", path), max_age_s=max_age_s)

    async def profile(self, *, fallback: ModelProfile | None = None) -> ModelProfile:
        """The served model's profile, from /props and /v1/models read at most ``RECENT_PROBE_S`` ago (a burst of
        requests probes once); ``fallback`` (else the one this prober was built with) supplies the shape when the
        server's model file can't be read from here."""
        props_json, models_json = await asyncio.gather(
            self._get("/props", RECENT_PROBE_S), self._get("/v1/models", RECENT_PROBE_S)
        )
        try:
            props, meta = parse_props(props_json), parse_models(models_json)
            profile = profile_from_llama_server(
                props, meta, await self._summary(props.model_path), fallback=fallback or self._fallback
            )
        except (ProfileError, ValueError) as exc:
            raise ProfileUnderivable(f"llama-server at {self.client.label}: {exc}") from exc
        unified, parallel, ctx_size = self._configured
        if unified is None:
            return profile
        warning = check_unified(
            configured_unified=unified, configured_parallel=parallel, configured_ctx_size=ctx_size, props=props,
            n_ctx_train=meta.n_ctx_train,
        )
        if warning is None:
            return profile
        return _with_warning(profile, warning)

    async def slots(self) -> list[SlotState]:
        try:
            return parse_slots(await self._call("GET", "/slots"))
        except ProfileError as exc:
            raise ProbeError(str(exc)) from exc


def _with_warning(profile: ModelProfile, warning: str) -> ModelProfile:
    return replace(profile, warnings=(*profile.warnings, warning))


async def detect_backend(client: BackendClient, *, timeout_s: float = 10.0) -> BackendKind:
    """Ollama or llama-server, by which of /api/version and /props answers."""
    prober = _Prober(client, timeout_s)
    try:
        version = await prober._call("GET", "/api/version")
        if isinstance(version, dict) and "version" in version:
            return BackendKind.OLLAMA
    except ProbeError:
        pass
    try:
        props = await prober._call("GET", "/props")
    except ProbeError as exc:
        raise ProbeError(f"{client.label} answers neither Ollama's /api/version nor llama-server's /props") from exc
    if isinstance(props, dict) and "default_generation_settings" in props:
        return BackendKind.LLAMA_SERVER
    raise ProbeError(f"{client.label} answers /props without default_generation_settings; not a llama-server")


def _identity(tag: TagEntry) -> str:
    """What names one version of a model: its digest, else its name and size (a re-pull changes either)."""
    return tag.digest or f"{tag.name}@{tag.size_bytes}"
