"""The simulator's failures, each carrying the HTTP status and the message the real server sends.

    SimError            a request fails with (status, message); rendered per dialect by the routes
    └── RunnerCrashed   the runner process died (runtime out of memory); every request on it fails

The message strings below are the real servers' (facts/ollama.md sections 4 and 6, llama-server.md section 2).
"""

from __future__ import annotations

from kvsim.gpu.vgpu import GIB, MIB, AllocationFailure

QUEUE_FULL = "server busy, please try again.  maximum pending requests exceeded"
REQUEST_CANCELED = "request canceled"
RUNNER_STOPPED = (
    "model runner has unexpectedly stopped, this may be due to resource limitations or an internal error, "
    "check ollama server logs for details"
)
CUDA_OOM_LINE = "CUDA error: out of memory"


class SimError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RunnerCrashed(SimError):
    pass


def cuda_alloc_line(failure: AllocationFailure) -> str:
    """llama.cpp's stderr line for a failed device allocation (ggml-cuda ``alloc_buffer``)."""
    mib = failure.requested_bytes / MIB
    return (
        f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {mib:.2f} MiB on device {failure.device}: "
        "cudaMalloc failed: out of memory"
    )


def load_oom(failure: AllocationFailure, era: str) -> SimError:
    """The 500 a load that does not fit gets (E3 ``llm/llama_server.go``; E2 ``llm/server.go``)."""
    if era == "e3":
        return SimError(500, f"llama-server reported out-of-memory during startup: {cuda_alloc_line(failure)}")
    return SimError(500, "llama runner process has terminated: cudaMalloc failed: out of memory")


def runtime_oom() -> RunnerCrashed:
    """A runner that crashed mid-generation (E3 and E2 share the wording)."""
    return RunnerCrashed(500, f"an error was encountered while running the model: {CUDA_OOM_LINE}")


def stopped_runner() -> SimError:
    return SimError(500, f"{RUNNER_STOPPED}: {CUDA_OOM_LINE}")


def load_aborted(era: str) -> SimError:
    if era == "e3":
        return SimError(500, "timed out waiting for llama-server to start: context canceled")
    return SimError(500, "timed out waiting for llama runner to start: context canceled")


def torch_oom(device: int, requested_bytes: int, total_bytes: int, free_bytes: int) -> SimError:
    """What a transformers-style server says when its growing KV cache hits the end of the GPU."""
    return SimError(
        500,
        f"CUDA out of memory. Tried to allocate {requested_bytes / MIB:.2f} MiB. GPU {device} has a total "
        f"capacity of {total_bytes / GIB:.2f} GiB of which {max(free_bytes, 0) / MIB:.2f} MiB is free.",
    )
