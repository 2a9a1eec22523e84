"""Readings -> findings (pure: no I/O, no clock). One small rule per question of facts/troubleshooting.md:

    host_findings       system RAM, swap, OOM-killer lines in the kernel log
    gpu_findings        GPU memory exhausted or close; memory held by processes that are not the backend
    model_findings      Ollama: models resident versus the limit; each model's context x parallel and its KV cache
    pool_findings       llama-server: slots, per-slot context, unified or split, versus the longest prompt
    cache_findings      the KV cache type and flash attention
    log_findings        the known out-of-memory signatures in --log files and --error messages

Thresholds are fractions of the total, named below; every finding that is not OK names its fix.
"""

from __future__ import annotations

import re

from gateway.cli.check.diagnose_context import model_findings, pool_findings
from gateway.cli.check.fixes import Finding, Fix, Knob, Severity, fix_for
from gateway.cli.check.readings import BackendReadings, HostReadings, Readings
from gateway.cli.check.signatures import SignatureMatch
from gateway.memory.estimate_table import format_bytes

CRITICAL_FREE_SHARE = 0.05
WARNING_FREE_SHARE = 0.10
SWAP_WARNING_SHARE = 0.5
FOREIGN_MIN_BYTES = 1 << 30
FOREIGN_MIN_SHARE = 0.05
BACKEND_PROCESS = re.compile(r"ollama|llama|runner", re.IGNORECASE)


def diagnose(readings: Readings) -> list[Finding]:
    findings = host_findings(readings.host, readings.backends)
    for backend in readings.backends:
        if backend.problem is not None:
            findings.append(Finding("backend_unreachable", Severity.CRITICAL, backend.problem,
                                    fix=Fix("--backend", "KIND=URL of the running server", "kvgate check"),
                                    backend=backend.name))
            continue
        findings += gpu_findings(backend)
        findings += model_findings(backend, readings.longest_prompt)
        findings += pool_findings(backend, readings.longest_prompt)
        findings += cache_findings(backend)
    findings += log_findings(readings.log_matches, readings.backends)
    if not readings.longest_prompt.known:
        findings.append(Finding("longest_prompt_unknown", Severity.INFO,
                                "the longest prompt is unknown, so the context cannot be checked against it",
                                fix=Fix("--prompt-tokens", "your longest prompt in tokens", "kvgate check"),
                                alternatives=(Fix("--log", "the backend's log", "kvgate check"),)))
    return sorted(findings, key=lambda f: -f.severity)


def _kind(backends: tuple[BackendReadings, ...]) -> str:
    return backends[0].kind if backends else "ollama"


def host_findings(host: HostReadings, backends: tuple[BackendReadings, ...]) -> list[Finding]:
    kind = _kind(backends)
    findings = []
    if host.ram is None:
        findings.append(Finding("system_ram_unknown", Severity.INFO, f"system RAM not readable: {host.ram_problem}"))
    else:
        ram = host.ram
        share = ram.available_bytes / ram.total_bytes if ram.total_bytes else 1.0
        severity = (Severity.CRITICAL if share < CRITICAL_FREE_SHARE else
                    Severity.WARNING if share < WARNING_FREE_SHARE else Severity.OK)
        swap_used = ram.swap_total_bytes - ram.swap_free_bytes
        evidence = (f"MemAvailable {format_bytes(ram.available_bytes)} of {format_bytes(ram.total_bytes)}",
                    f"swap used {format_bytes(swap_used)} of {format_bytes(ram.swap_total_bytes)}")
        what = (f"system RAM: {format_bytes(ram.available_bytes)} available of {format_bytes(ram.total_bytes)} "
                f"({share:.0%})")
        if severity is Severity.OK and ram.swap_total_bytes and swap_used > SWAP_WARNING_SHARE * ram.swap_total_bytes:
            severity, what = Severity.WARNING, f"{what}; swap is {swap_used / ram.swap_total_bytes:.0%} used"
        fix = fix_for(Knob.SYSTEM_RAM, kind) if severity > Severity.OK else None
        findings.append(Finding("system_ram", severity, what, evidence, fix))
    if host.kernel_problem is not None:
        findings.append(Finding("kernel_log_unreadable", Severity.INFO,
                                f"kernel log not readable ({host.kernel_problem}): OOM-killer lines not checked",
                                fix=Fix("run kvgate check as root", "or: sudo dmesg | grep -i oom", "the GPU host")))
    elif host.kernel_oom_lines:
        findings.append(Finding("oom_killer", Severity.CRITICAL,
                                f"the kernel's OOM killer ended processes ({len(host.kernel_oom_lines)} lines in "
                                f"{host.kernel_source}): system RAM ran out", host.kernel_oom_lines[-5:],
                                fix_for(Knob.SYSTEM_RAM, kind)))
    else:
        findings.append(Finding("kernel_log", Severity.OK, f"no OOM-killer lines in {host.kernel_source}"))
    return findings


def gpu_findings(backend: BackendReadings) -> list[Finding]:
    reading = backend.vram
    if reading is None:
        what = (f"GPU memory not read: {backend.vram_problem}" if backend.vram_problem else
                "GPU memory not read: no VRAM source (set vram = \"nvml\", an exporter URL or a size, or --vram)")
        return [Finding("gpu_unknown", Severity.INFO, what, backend=backend.name,
                        fix=Fix("--vram", "nvml", "kvgate check (or vram in kvgate config)"))]
    total, free = reading.total_bytes, reading.free_bytes
    share = free / total if total else 1.0
    severity = (Severity.CRITICAL if share < CRITICAL_FREE_SHARE else
                Severity.WARNING if share < WARNING_FREE_SHARE else Severity.OK)
    evidence = tuple(f"GPU {d.index} {d.name}: {format_bytes(d.free_bytes)} free of {format_bytes(d.total_bytes)}"
                     for d in reading.devices)
    fix = None
    if severity > Severity.OK:
        fix = (fix_for(Knob.MAX_LOADED, backend.kind, "1") if len(backend.residents) > 1 else
               fix_for(Knob.KV_TYPE, backend.kind) if backend.settings.type_k.value in (None, "f16") else
               fix_for(Knob.CONTEXT, backend.kind))
    findings = [Finding("gpu_memory", severity, f"GPU memory ({reading.source}): {format_bytes(free)} free of "
                        f"{format_bytes(total)} ({share:.0%})", evidence, fix, backend=backend.name,
                        data={"total_bytes": total, "free_bytes": free})]
    return findings + _foreign(backend)


def _foreign(backend: BackendReadings) -> list[Finding]:
    reading = backend.vram
    assert reading is not None
    if reading.processes:
        others = [p for p in reading.processes if not BACKEND_PROCESS.search(p.name or "")
                  and (p.used_bytes or 0) >= FOREIGN_MIN_BYTES // 4]
        if not others:
            return []
        held = sum(p.used_bytes or 0 for p in others)
        evidence = tuple(f"pid {p.pid} {p.name or '?'}: {format_bytes(p.used_bytes)} on GPU {p.device_index}"
                         for p in others)
        first = others[0]
        return [_foreign_finding(backend, held, evidence, Fix(f"process {first.pid} ({first.name or '?'})",
                                                              "stop it", "the GPU host"))]
    if not backend.residents or any(m.loaded.size_vram_bytes <= 0 for m in backend.residents):
        return []  # only Ollama reports what its models hold; the rest of the used bytes is someone else's
    held = reading.used_bytes - sum(m.loaded.size_vram_bytes for m in backend.residents)
    if held < max(FOREIGN_MIN_BYTES, FOREIGN_MIN_SHARE * reading.total_bytes):
        return []
    evidence = (f"GPU used {format_bytes(reading.used_bytes)}; the backend's models hold "
                f"{format_bytes(reading.used_bytes - held)} (/api/ps size_vram)",
                f"{reading.source} lists no processes: run nvidia-smi on the GPU host to name them")
    return [_foreign_finding(backend, held, evidence, fix_for(Knob.OTHER_PROCESS, backend.kind))]


def _foreign_finding(backend: BackendReadings, held: int, evidence: tuple[str, ...], fix: Fix) -> Finding:
    alternatives = (fix_for(Knob.GPU_OVERHEAD, backend.kind, str(held)),) if backend.kind == "ollama" else ()
    return Finding("foreign_gpu_process", Severity.WARNING,
                   f"{format_bytes(held)} of GPU memory is held by processes that are not the backend", evidence, fix,
                   alternatives, backend=backend.name, data={"held_bytes": held})


def cache_findings(backend: BackendReadings) -> list[Finding]:
    seen = backend.settings
    type_k, type_v, flash = seen.type_k.value, seen.type_v.value, seen.flash_attn.value
    flash_text = "unknown" if flash is None else "on" if flash else "off"
    what = f"KV cache type K={type_k or 'unknown'} V={type_v or 'unknown'}, flash attention {flash_text}"
    evidence = (f"cache type from {seen.type_k.source}", f"flash attention from {seen.flash_attn.source}")
    if type_v not in (None, "f16", "f32", "bf16") and flash is False:
        return [Finding("quantized_v_without_flash_attn", Severity.CRITICAL,
                        f"{what}: a quantized V cache needs flash attention", evidence,
                        fix_for(Knob.FLASH_ATTN, backend.kind), backend=backend.name)]
    pressed = backend.vram is not None and backend.vram.free_bytes < WARNING_FREE_SHARE * backend.vram.total_bytes
    if type_k == "f16" and pressed:
        return [Finding("kv_cache_f16", Severity.WARNING,
                        f"{what}: q8_0 with flash attention halves the KV cache", evidence,
                        fix_for(Knob.KV_TYPE, backend.kind), (fix_for(Knob.FLASH_ATTN, backend.kind),),
                        backend=backend.name)]
    severity = Severity.INFO if type_k is None or flash is None else Severity.OK
    fix = Fix("--log", "the backend's log (it prints both)", "kvgate check") if severity is Severity.INFO else None
    return [Finding("kv_cache_type", severity, what, evidence, fix, backend=backend.name)]


def log_findings(matches: tuple[SignatureMatch, ...], backends: tuple[BackendReadings, ...]) -> list[Finding]:
    kind = _kind(backends)
    findings = []
    for match in matches:
        signature = match.signature
        value = None
        if "prompt" in match.groups:
            value = str(pow2_above(int(match.groups["prompt"])))
            value = f"{value} per slot" if kind != "ollama" else value
        findings.append(Finding(
            f"signature:{signature.code}", signature.severity, signature.meaning,
            (f"{match.line}" + (f"  (x{match.count})" if match.count > 1 else ""),),
            fix_for(signature.knob, kind, value), backend=backends[0].name if len(backends) == 1 else None,
            data={"signature": signature.code, "count": match.count, **match.groups}))
    return findings


def pow2_above(tokens: int) -> int:
    return 1 << tokens.bit_length()
