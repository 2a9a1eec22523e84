"""The known out-of-memory (and out-of-context) messages of Ollama, llama-server and the kernel, as one table, and a
pure matcher. Sources: facts/ollama.md sections 4.6 and 6 (its ``llm/status.go`` OOM substrings), llama-server.md
section 2, troubleshooting.md. Order matters: each line is attributed to the first signature that matches it, so
the specific ones come before the generic ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.cli.check.fixes import Knob, Severity


@dataclass(frozen=True)
class Signature:
    code: str
    pattern: re.Pattern[str]
    meaning: str
    knob: Knob
    severity: Severity
    example: str  # a real line this signature must match (tests/cli/check/test_signatures.py)


def _sig(code: str, pattern: str, meaning: str, knob: Knob, severity: Severity, example: str) -> Signature:
    return Signature(code, re.compile(pattern, re.IGNORECASE), meaning, knob, severity, example)


SIGNATURES: tuple[Signature, ...] = (
    _sig("kv_cache_alloc_failed",
         r"failed to allocate (?:the )?(?:\w+ )?KV cache|llama_new_context_with_model: failed to allocate|"
         r"llama_kv_cache\w*: failed to allocate",
         "the configured context is reserved in full at load time, and its KV cache does not fit beside the weights",
         Knob.CONTEXT, Severity.CRITICAL, "llama_new_context_with_model: failed to allocate KV cache"),
    _sig("ollama_startup_oom", r"llama-server reported out-of-memory during startup",
         "Ollama's runner ran out of GPU memory while loading: weights + KV cache (context x parallel) + compute "
         "buffers exceed free VRAM", Knob.CONTEXT, Severity.CRITICAL,
         "llama-server reported out-of-memory during startup: ggml_backend_cuda_buffer_type_alloc_buffer: "
         "allocating 4096.00 MiB on device 0: cudaMalloc failed: out of memory"),
    _sig("runner_terminated", r"llama runner process has terminated|llama-server process has terminated",
         "the backend's runner died while loading; with an out-of-memory line, weights + KV cache + workspace "
         "exceed VRAM", Knob.CONTEXT, Severity.CRITICAL,
         "llama runner process has terminated: cudaMalloc failed: out of memory"),
    _sig("gpu_alloc_failed",
         r"(?:cuda|hip)Malloc failed|out of device memory|vk_error_out_of_device_memory|erroroutofdevicememory",
         "a GPU buffer could not be allocated: weights + KV cache + compute buffers exceed free VRAM",
         Knob.CONTEXT, Severity.CRITICAL,
         "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1024.00 MiB on device 0: cudaMalloc failed: "
         "out of memory"),
    _sig("system_memory_precheck",
         r"model requires more system memory \((?P<need>[^)]+)\) than is available \((?P<have>[^)]+)\)",
         "Ollama's own pre-check refused the load: the part of the model kept on the CPU does not fit system RAM",
         Knob.MAX_LOADED, Severity.CRITICAL,
         "model requires more system memory (12.3 GiB) than is available (8.1 GiB)"),
    _sig("torch_cuda_oom", r"CUDA out of memory\. Tried to allocate",
         "a PyTorch process on the same GPU ran out of memory: the GPU is shared with another server or job",
         Knob.OTHER_PROCESS, Severity.WARNING,
         "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 24.00 GiB of which "
         "512.00 MiB is free."),
    _sig("runner_stopped", r"model runner has unexpectedly stopped",
         "a request reached a runner that had died, usually of running out of memory", Knob.CONTEXT,
         Severity.CRITICAL, "model runner has unexpectedly stopped, this may be due to resource limitations or an "
         "internal error, check ollama server logs for details"),
    _sig("runtime_oom",
         r"CUDA error: out of memory|an error was encountered while running the model|runtime OOM detected",
         "the GPU ran out during inference (the KV cache is already allocated, so it is the prefill workspace or "
         "another process growing); Ollama then unloads every model", Knob.FLASH_ATTN, Severity.CRITICAL,
         "an error was encountered while running the model: CUDA error: out of memory"),
    _sig("unified_pool_exceeded", r"Context size has been exceeded",
         "llama-server's unified KV pool was oversubscribed by concurrent requests: every active generation failed",
         Knob.SPLIT_POOL, Severity.CRITICAL,
         '{"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}'),
    _sig("kv_no_free_space", r"failed to find free space in the KV cache|failed to find a memory slot for batch",
         "the KV pool is full (llama-server retries with smaller batches, then fails every active slot)",
         Knob.SPLIT_POOL, Severity.WARNING,
         "decode: failed to find a memory slot for batch of size 2048"),
    _sig("prompt_exceeds_slot",
         r"request \((?P<prompt>\d+) tokens\) exceeds the available context size \((?P<slot>\d+) tokens\)|"
         r"the request exceeds the available context size",
         "a prompt is longer than llama-server's per-slot context", Knob.CONTEXT, Severity.WARNING,
         "request (2122 tokens) exceeds the available context size (2048 tokens), try increasing it"),
    _sig("input_exceeds_context",
         r"the input length exceeds the context length|input exceeds maximum context length",
         "a prompt is longer than the model's num_ctx (Ollama refuses it when truncation is off)", Knob.CONTEXT,
         Severity.WARNING, "the input length exceeds the context length"),
    _sig("quantized_v_needs_flash_attn",
         r"OLLAMA_FLASH_ATTENTION must be enabled to use a quantized|quantized V cache .*flash",
         "a quantized KV cache was asked for without flash attention: it fell back to f16 (or failed)",
         Knob.FLASH_ATTN, Severity.WARNING,
         "OLLAMA_FLASH_ATTENTION must be enabled to use a quantized OLLAMA_KV_CACHE_TYPE"),
    _sig("oom_killer", r"Out of memory: Killed process|invoked oom-killer|oom-kill:|oom_reaper",
         "the kernel's OOM killer ended a process: system RAM (offloaded layers, CPU KV cache) ran out",
         Knob.SYSTEM_RAM, Severity.CRITICAL,
         "Out of memory: Killed process 4242 (ollama) total-vm:40960000kB, anon-rss:30000000kB"),
    _sig("killed", r"^\s*Killed\s*$|signal: killed",
         "the process was killed with no CUDA error: usually the kernel's OOM killer (system RAM)",
         Knob.SYSTEM_RAM, Severity.CRITICAL, "Killed"),
    _sig("generic_oom",
         r"not enough memory|insufficient memory|allocation failed|failed to allocate|\bout of memory\b",
         "an allocation failed (Ollama's generic out-of-memory patterns)", Knob.CONTEXT, Severity.WARNING,
         "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 1234"),
)


@dataclass(frozen=True)
class SignatureMatch:
    signature: Signature
    line: str  # the first line that matched (stripped, at most 300 characters)
    count: int
    groups: dict[str, str]


def classify(line: str) -> tuple[Signature, dict[str, str]] | None:
    """The first signature that matches ``line``, with its named groups."""
    for signature in SIGNATURES:
        found = signature.pattern.search(line)
        if found:
            return signature, {k: v for k, v in found.groupdict().items() if v is not None}
    return None


def match_signatures(lines: Iterable[str]) -> tuple[SignatureMatch, ...]:
    """One match per signature seen in ``lines``, in the table's order, each with its first line and a count."""
    first: dict[str, SignatureMatch] = {}
    for raw in lines:
        for line in raw.splitlines() or [raw]:
            hit = classify(line)
            if hit is None:
                continue
            signature, groups = hit
            seen = first.get(signature.code)
            if seen is None:
                first[signature.code] = SignatureMatch(signature, line.strip()[:300], 1, groups)
            else:
                first[signature.code] = SignatureMatch(signature, seen.line, seen.count + 1, seen.groups)
    order = {s.code: i for i, s in enumerate(SIGNATURES)}
    return tuple(sorted(first.values(), key=lambda m: order[m.signature.code]))
