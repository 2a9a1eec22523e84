"""An Ollama model nothing names a context for: "does not fit" is a decision with numbers, "could not probe" a 503."""

from __future__ import annotations

from typing import cast

import pytest

from gateway.admission.kv_pools import PoolDirectory
from gateway.backends import Backend
from gateway.backends.client import BackendClient
from gateway.backends.prober import ProbeError, ProfileUnderivable
from gateway.backends.probes import BackendProbes
from gateway.config.settings import BackendSettings, load_settings
from gateway.errors import BackendNotReady
from gateway.memory.presets import preset_profile
from gateway.memory.profile import ModelProfile
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.memory.vram import StaticVramSource, VramReading
from gateway.runtimes import runtime_for

MODEL = "llama3.1:8b"


class _Probes:
    """The probes PoolDirectory asks of an Ollama backend whose model is not loaded and can't be loaded."""

    def __init__(self, *, vram: str | None, profile_error: ProbeError | None = None) -> None:
        self._vram = vram
        self._profile_error = profile_error

    async def loaded_model(self, backend: Backend, model: str, *, join_running: bool = True) -> LoadedModel | None:
        return None

    async def load_model(self, backend: Backend, model: str, num_ctx: int | None) -> None:
        raise ProbeError("POST /api/generate answered HTTP 500: out of memory")

    async def profile(self, backend: Backend, model: str) -> ModelProfile:
        if self._profile_error is not None:
            raise self._profile_error
        return preset_profile(model)

    async def vram(self, backend: Backend) -> VramReading | None:
        return None if self._vram is None else await StaticVramSource.from_text(self._vram).read()


def _profile_unusable() -> ProbeError:
    """What the prober raises when the backend answered but its metadata gives no KV profile."""
    return ProfileUnderivable(f"Ollama model {MODEL}: general.architecture 'mamba9' is not supported")


async def _sleep(_: float) -> None:
    return None


def _directory(probes: _Probes) -> tuple[PoolDirectory, Backend]:
    settings = load_settings(None, admission={"probe_wait_s": 1.0, "default_context_tokens": 4096})
    config = BackendSettings(name="oll", url="http://127.0.0.1:9")
    backend = Backend(config, cast(BackendClient, None), runtime=runtime_for(config.kind))
    return PoolDirectory(settings, cast(BackendProbes, probes), sleep=_sleep), backend


@pytest.mark.parametrize(
    ("probes", "context", "note"),
    [
        (_Probes(vram="1GiB"), 4096, "does not fit free VRAM: 4.7 GiB needed at a context of 256 tokens, 1.0 GiB free"),
        (_Probes(vram=None), 4096, "no VRAM source is configured"),
        (_Probes(vram="24GiB", profile_error=_profile_unusable()), 4096, "its profile can't be derived"),
        (_Probes(vram="24GiB"), 32768, None),
    ],
    ids=["does-not-fit", "no-vram-reading", "no-profile", "fits"],
)
async def test_a_model_that_does_not_fit_is_planned_at_the_default_context_with_a_note(
    probes: _Probes, context: int, note: str | None
) -> None:
    pools, backend = _directory(probes)
    pool = await pools.pool_for(backend, MODEL)
    assert pool is not None and pool.slot_ctx_tokens == context
    notes = pools.notes_for(pool)
    if note is None:
        assert notes == ()
    else:
        assert len(notes) == 1 and note in notes[0] and "planned with a context of 4096 tokens" in notes[0]


async def test_a_backend_that_cant_be_asked_is_not_ready_not_a_fallback() -> None:
    pools, backend = _directory(_Probes(vram="24GiB", profile_error=ProbeError("GET /api/tags failed: refused")))
    with pytest.raises(BackendNotReady, match="refused"):
        await pools.pool_for(backend, MODEL)
