"""Issue 23, point 4e, the pure part: which backend answers are a GPU out-of-memory, and what kvgate does after one."""

from __future__ import annotations

import pytest

from gateway.errors import LoadRefused
from gateway.loads.oom import names_gpu_oom, oom_refusal, room_after_oom
from gateway.loads.plan import LoadAction, LoadDecision


@pytest.mark.parametrize(("status", "text", "oom"), [
    (500, "an error was encountered while running the model: CUDA error: out of memory", True),
    (500, "llama runner process has terminated: cudaMalloc failed: out of memory", True),
    (500, "llama-server reported out-of-memory during startup: ggml_backend_cuda_buffer_type_alloc_buffer", True),
    (500, "CUDA out of memory. Tried to allocate 2.00 GiB", True),
    (500, "model requires more system memory (12 GiB) than is available", False),
    (500, "boom", False),
    (400, "out of memory", False),
])  # fmt: skip
def test_names_gpu_oom(status: int, text: str, oom: bool) -> None:
    assert names_gpu_oom(status, text) is oom


class _Gate:
    def __init__(self, action: LoadAction | None) -> None:
        self.action = action
        self.asked = 0

    async def decide_fresh(self, backend: object, model: str) -> LoadDecision | None:
        self.asked += 1
        return None if self.action is None else LoadDecision(self.action, model, 4096, 9 << 30, 4 << 30)


class _Backend:
    def describe(self) -> str:
        return "backend 'b'"


@pytest.mark.parametrize(("action", "retried", "outcome"), [
    (LoadAction.LOAD, False, "retry"), (LoadAction.REFUSE, False, "503"), (LoadAction.WAIT, False, "503"),
    (None, False, "503"), (LoadAction.LOAD, True, "503"),
])  # fmt: skip
async def test_room_after_oom(action: LoadAction | None, retried: bool, outcome: str) -> None:
    gate = _Gate(action)
    try:
        await room_after_oom(gate, _Backend(), "m", "CUDA error: out of memory", retried=retried)  # type: ignore[arg-type]
        got = "retry"
    except LoadRefused as refused:
        got = "503"
        assert refused.code == "gpu_memory_exhausted" and refused.retry_after_s is not None
        assert "ran out of GPU memory" in refused.message and "CUDA error: out of memory" in refused.message
    assert got == outcome
    assert gate.asked == (0 if retried else 1)  # a fresh reading, once, before the one retry


def test_the_refusal_names_the_model_and_the_words() -> None:
    refused = oom_refusal("backend 'b'", "llama3.1:8b", "cudaMalloc failed: out of memory", retried=True)
    assert refused.status == 503 and "again after one retry" in refused.message and "'llama3.1:8b'" in refused.message
