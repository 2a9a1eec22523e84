"""Load admission and residency settings (``[residency]``): how kvgate loads models on an Ollama backend with a
``vram`` source, and which stay resident (gateway/admission/loads.py, load_plan.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ByteSize, Field

from gateway.config_base import _Strict


class ResidencyConfig(_Strict):
    """Load admission on Ollama backends with a ``vram`` source (gateway/admission/loads.py): a model loads only when
    it fits the GPU, idle models are unloaded to make room, least recently used first."""

    enabled: bool = True
    headroom_bytes: ByteSize = Field(
        default=ByteSize(512 * 1024 * 1024), ge=0, description="GPU memory every load leaves free",
    )
    min_context_tokens: int = Field(
        default=2048, ge=256, description="the floor a model's context is lowered to when the asked one doesn't fit",
    )
    min_resident_s: float = Field(
        default=30.0, ge=0, description="a model loaded more recently than this is not unloaded for another",
    )
    load_wait_s: float = Field(
        default=30.0, gt=0, description="how long a load waits for room (models in use, hysteresis) before a 503",
    )
    allow_cpu_offload: bool = Field(
        default=False, description="a model too big for the GPU may load partly on the CPU when the backend runs on "
        "this host and its system RAM (/proc/meminfo) holds the offloaded layers without swapping",
    )
    meminfo_path: Path = Field(
        default=Path("/proc/meminfo"), description="where system RAM is read (in a container: the host's, mounted)",
    )
