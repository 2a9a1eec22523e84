"""A GPU out-of-memory after kvgate admitted a load (issue 23, point 4e).

kvgate's check reads the GPU and decides a load fits; a foreign process that starts a moment later (or a ``vram``
source that can't see it) still makes the load, or the runner's first request, fail: Ollama answers 500 with
``cudaMalloc failed: out of memory``, ``llama-server reported out-of-memory during startup``, or ``CUDA error: out
of memory``. What kvgate does then, once per request:

    fresh GPU reading shows room (the load gate would load now)   one retry: the load, then the request, again
    it shows none (or no gate applies, or the retry ran out too)  503 ``gpu_memory_exhausted`` with Retry-After, in
                                                                  the route's format, naming the model and the
                                                                  backend's words; never the raw 500

Only before anything reached the client: an out-of-memory in the middle of a stream ends it with an error event, as
any broken stream does.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from gateway.errors import LoadRefused
from gateway.loads.plan import LoadAction

if TYPE_CHECKING:
    from gateway.backends import Backend
    from gateway.loads.gate import LoadGate

log = logging.getLogger(__name__)

OOM_RETRY_AFTER_S = 5.0
"""Retry-After of an out-of-memory refusal with no reading to say when room comes back."""
_OOM = re.compile(r"out of memory|out-of-memory|cudaMalloc failed|failed to allocate", re.IGNORECASE)
MAX_ERROR_BYTES = 64 * 1024
"""The largest error body read to look for an out-of-memory (backends' errors are one short JSON object)."""


class GpuOutOfMemory(Exception):
    """The backend answered 500 out of memory before anything reached the client; ``words``: its message."""

    def __init__(self, words: str) -> None:
        super().__init__(words)
        self.words = words
        self.model = ""


def names_gpu_oom(status: int, text: str) -> bool:
    """Whether a backend's answer is a GPU out-of-memory (a 500 whose message says so)."""
    return status == 500 and bool(_OOM.search(text))


def oom_refusal(where: str, model: str, words: str, *, retried: bool) -> LoadRefused:
    """The 503 of an out-of-memory kvgate can't cure by a retry."""
    tried = " again after one retry" if retried else ""
    return LoadRefused(
        f"{where} ran out of GPU memory{tried} loading or running model {model!r} (it said: {words[:300]}); another "
        "process may have taken the memory kvgate's check saw free; retry later, or free GPU memory",
        retry_after_s=OOM_RETRY_AFTER_S,
    )


async def room_after_oom(gate: LoadGate | None, backend: Backend, model: str, words: str, *, retried: bool) -> None:
    """After a request met the backend's out-of-memory: return when a fresh GPU reading shows room for one retry;
    raise LoadRefused (503) when it shows none, no gate applies, or this was the retry."""
    decision = None if gate is None or retried else await gate.decide_fresh(backend, model)
    if decision is not None and decision.action is LoadAction.LOAD:
        log.warning("%s ran out of GPU memory running model %r (%s); a fresh reading shows room: retrying once",
                    backend.describe(), model, words)
        return
    refusal = oom_refusal(backend.describe(), model, words, retried=retried)
    if decision is not None:
        refusal.message = f"{refusal.message}; GPU now: {decision.describe()}"
    raise refusal
