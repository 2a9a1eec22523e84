"""Load admission and residency settings (``[residency]``): how kvgate loads models on an Ollama backend with a
``vram`` source, and which stay resident (gateway/loads/gate.py, plan.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ByteSize, Field, model_validator

from gateway.config.base import Strict

GpuFull = Literal["offload", "wait", "refuse"]
ClientKeepAlive = Literal["strip", "refuse", "allow"]


class ResidencySettings(Strict):
    """Load admission on Ollama backends with a ``vram`` source (gateway/loads/gate.py): a model loads only when
    it fits the GPU, idle models are unloaded to make room, least recently used first."""

    enabled: bool = True
    headroom_bytes: ByteSize = Field(
        default=ByteSize(512 * 1024 * 1024), ge=0, description="GPU memory every load leaves free",
    )
    min_context_tokens: int = Field(
        default=2048, ge=256, description="the floor a model's context is lowered to when the asked one doesn't fit",
    )
    min_resident_s: float = Field(
        default=0.0, ge=0, description="a model loaded more recently than this is not unloaded for another (0: as "
        "Ollama does, an idle model makes room at once; set it, e.g. 30, so that two models taking turns swap at "
        "most once per interval)",
    )
    load_wait_s: float = Field(
        default=30.0, gt=0, description="how long a load waits for room (models in use, hysteresis) before a 503",
    )
    when_gpu_full: GpuFull = Field(
        default="offload", description="a load that can't fit the GPU even after unloading idle models and "
        "lowering the context: 'offload' loads it partly on the CPU, as the backend itself would (when it does: "
        "cpu_offload, and when system RAM holds the offloaded layers without swapping), announced in "
        "X-Kvgate-Offload; 'wait' waits load_wait_s for GPU memory, then 503; 'refuse' answers 503 at once",
    )
    client_keep_alive: ClientKeepAlive = Field(
        default="strip", description="a client's keep_alive 0 (unload at once) or negative (pin for good) on Ollama's "
        "routes, unless it carries server.admin_key: 'strip' removes it (said in X-Kvgate-Keep-Alive), 'refuse' "
        "answers 400, 'allow' forwards it. Load and unload requests go through the GPU check either way",
    )
    allow_cpu_offload: bool | None = Field(
        default=None, description="deprecated: use when_gpu_full (true is 'offload', false is 'refuse')",
    )
    meminfo_path: Path = Field(
        default=Path("/proc/meminfo"), description="where system RAM is read (in a container: the host's, mounted)",
    )

    @model_validator(mode="before")
    @classmethod
    def _deprecated_key(cls, data: Any) -> Any:
        """The deprecated ``allow_cpu_offload`` is read as ``when_gpu_full`` (true: 'offload', false: 'refuse')."""
        if not isinstance(data, dict) or data.get("allow_cpu_offload") is None:
            return data
        old = data["allow_cpu_offload"]
        if not isinstance(old, bool):
            return data  # the field's own validation names it
        given = data.get("when_gpu_full")
        if given is not None and given != _mapped(old):
            raise ValueError(f"residency.allow_cpu_offload = {str(old).lower()} (deprecated) and residency."
                             f"when_gpu_full = '{given}' disagree; keep when_gpu_full alone")
        return {**data, "when_gpu_full": _mapped(old)}

    def deprecations(self) -> list[str]:
        """What start-up logs about deprecated keys the file still has."""
        if self.allow_cpu_offload is None:
            return []
        return [f"residency.allow_cpu_offload is deprecated: it is read as residency.when_gpu_full = "
                f"'{_mapped(self.allow_cpu_offload)}'; write that instead"]


def _mapped(allow_cpu_offload: bool) -> GpuFull:
    return "offload" if allow_cpu_offload else "refuse"
