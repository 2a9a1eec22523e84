"""The context actually allocated, versus free memory and the longest prompt seen (pure).

Ollama: each resident model holds ``context_length x OLLAMA_NUM_PARALLEL`` cells of KV cache, allocated in full at
load (/api/ps ``context_length`` is per sequence). llama-server: ``-c`` tokens shared by the slots (unified) or
split among them; /props' per-slot ``n_ctx`` is the whole pool when unified (llama-server.md section 3).
"""

from __future__ import annotations

from gateway.cli.check.fixes import KVGATE_CONFIG, Finding, Fix, Knob, Severity, fix_for
from gateway.cli.check.memory_math import cache_type, largest_fitting_context, ollama_kv_bytes, pow2_at_least
from gateway.cli.check.readings import BackendReadings, Known, ResidentModel
from gateway.domain import BackendKind
from gateway.memory.estimate_table import format_bytes
from gateway.memory.kv import ShapeError
from gateway.memory.ollama_slots import infer_ollama_slots
from gateway.observability.pool_layout import layout_label
from gateway.runtimes import PoolSource, runtime_for

OVERSIZED_FACTOR = 4
"""A context this many times the longest prompt (and above OVERSIZED_MIN_TOKENS) reserves cache nobody uses."""
OVERSIZED_MIN_TOKENS = 8192
DEFAULT_MAX_LOADED_PER_GPU = 3


def _tokens(n: int) -> str:
    return f"{n:,}"


def model_findings(backend: BackendReadings, longest: Known[int]) -> list[Finding]:
    if not runtime_for(BackendKind(backend.kind)).lists_loaded_models:  # the residents come from its /api/ps
        return []
    findings = [_resident_count(backend)] if backend.residents else []
    for model in backend.residents:
        findings += _model_context(backend, model, longest)
    return [f for f in findings if f is not None]


def _resident_count(backend: BackendReadings) -> Finding:
    count = len(backend.residents)
    devices = len(backend.vram.devices) if backend.vram else 1
    limit = backend.settings.max_loaded_models
    limit_value = limit.value or DEFAULT_MAX_LOADED_PER_GPU * devices
    source = limit.source if limit.known else f"Ollama's default, {DEFAULT_MAX_LOADED_PER_GPU} per GPU"
    names = tuple(f"{m.loaded.name}: {format_bytes(m.loaded.size_vram_bytes)} on the GPU of "
                  f"{format_bytes(m.loaded.size_bytes)}" for m in backend.residents)
    what = f"{count} model(s) resident; the limit (OLLAMA_MAX_LOADED_MODELS) is {limit_value} ({source})"
    reading = backend.vram
    pressed = reading is not None and reading.free_bytes < 0.10 * reading.total_bytes
    offloaded = [m for m in backend.residents if m.loaded.size_vram_bytes < m.loaded.size_bytes]
    if count > 1 and (pressed or offloaded):
        return Finding("too_many_models", Severity.WARNING, f"{what}; together they fill the GPU", names,
                       fix_for(Knob.MAX_LOADED, "ollama", str(count - 1)), backend=backend.name,
                       data={"resident": count, "limit": limit_value})
    severity = Severity.INFO if count >= limit_value else Severity.OK
    return Finding("models_resident", severity, what, names, backend=backend.name,
                   data={"resident": count, "limit": limit_value})


def _prompt_text(longest: Known[int]) -> str:
    return f"{_tokens(longest.value)} ({longest.source})" if longest.value is not None else "unknown"


def _infer_parallel(backend: BackendReadings, model: ResidentModel) -> tuple[int, str]:
    """OLLAMA_NUM_PARALLEL, when no log says it: read from the /api/ps size, as ``kvgate serve`` reads it
    (gateway.memory.ollama_slots)."""
    assert model.profile is not None
    seen = backend.settings
    inferred = infer_ollama_slots(model.profile, model.loaded, type_k=cache_type(seen.type_k.value),
                                  type_v=cache_type(seen.type_v.value), version=backend.version)
    return inferred.slots, f"{inferred.reason} (pass --log for Ollama's OLLAMA_NUM_PARALLEL)"


def _model_context(backend: BackendReadings, model: ResidentModel, longest: Known[int]) -> list[Finding]:
    loaded, profile = model.loaded, model.profile
    seen = backend.settings
    parallel = seen.parallel.value or 1
    if loaded.context_tokens is None or profile is None:
        why = model.problem or "/api/ps has no context_length (Ollama before v0.9.7)"
        return [Finding("context_unknown", Severity.INFO, f"{loaded.name}: context and KV cache unknown: {why}",
                        backend=backend.name)]
    num_ctx = loaded.context_tokens
    parallel_source = seen.parallel.source
    if parallel_source.startswith("assumed"):
        parallel, parallel_source = _infer_parallel(backend, model)
    try:
        kv = ollama_kv_bytes(profile.shape, num_ctx, parallel, seen.type_k.value, seen.type_v.value)
    except ShapeError as exc:
        return [Finding("context_unknown", Severity.INFO, f"{loaded.name}: KV cache not computable: {exc}",
                        backend=backend.name)]
    head = (f"{loaded.name}: num_ctx {_tokens(num_ctx)} x OLLAMA_NUM_PARALLEL {parallel} needs "
            f"{format_bytes(kv)} of KV cache")
    evidence = (f"/api/ps context_length {_tokens(num_ctx)}; size {format_bytes(loaded.size_bytes)}, on the GPU "
                f"{format_bytes(loaded.size_vram_bytes)}", f"parallel from {parallel_source}",
                f"longest prompt: {_prompt_text(longest)}")
    data = {"model": loaded.name, "num_ctx": num_ctx, "parallel": parallel, "kv_bytes": kv}
    fixed = max(0, loaded.size_bytes - kv)  # weights + compute buffers, as Ollama sized the load
    free = backend.vram.free_bytes if backend.vram else None
    if loaded.size_vram_bytes < loaded.size_bytes and free is not None:
        budget = loaded.size_vram_bytes + free
        fit = largest_fitting_context(profile.shape, parallel=parallel, fixed_bytes=fixed, budget_bytes=budget,
                                      upper_tokens=num_ctx, type_k=seen.type_k.value, type_v=seen.type_v.value)
        share = 1 - loaded.size_vram_bytes / loaded.size_bytes
        what = (f"{head}, {format_bytes(free)} free: {share:.0%} of the model runs on the CPU (slow, and it "
                "holds system RAM)")
        alternatives = tuple(fix_for(k, "ollama") for k in (Knob.PARALLEL, Knob.KV_TYPE)
                             if k is not Knob.PARALLEL or parallel > 1)
        fix = fix_for(Knob.CONTEXT, "ollama", str(fit)) if fit else fix_for(Knob.MAX_LOADED, "ollama", "1")
        return [Finding("context_too_large", Severity.CRITICAL, what, evidence, fix, alternatives,
                        backend=backend.name, data={**data, "suggested_num_ctx": fit})]
    if longest.value is not None and longest.value >= num_ctx:
        want = pow2_at_least(longest.value + longest.value // 8)
        return [Finding("prompt_exceeds_context", Severity.WARNING,
                        f"{head}; prompts of {_tokens(longest.value)} tokens do not fit it (Ollama truncates them "
                        "silently)", evidence, fix_for(Knob.CONTEXT, "ollama", str(want)), backend=backend.name,
                        data={**data, "suggested_num_ctx": want})]
    if longest.value is not None and num_ctx >= OVERSIZED_FACTOR * longest.value and num_ctx > OVERSIZED_MIN_TOKENS:
        want = max(pow2_at_least(longest.value + longest.value // 4), 2048)
        saved = kv - ollama_kv_bytes(profile.shape, want, parallel, seen.type_k.value, seen.type_v.value)
        return [Finding("context_oversized", Severity.WARNING,
                        f"{head} for prompts of at most {_tokens(longest.value)} tokens: "
                        f"OLLAMA_CONTEXT_LENGTH={want} frees {format_bytes(saved)}", evidence,
                        fix_for(Knob.CONTEXT, "ollama", str(want)), backend=backend.name,
                        data={**data, "suggested_num_ctx": want, "saved_bytes": saved})]
    return [Finding("context_allocated", Severity.OK, head, evidence, backend=backend.name, data=data)]


def pool_findings(backend: BackendReadings, longest: Known[int]) -> list[Finding]:
    props = backend.props
    if runtime_for(BackendKind(backend.kind)).pool_source is not PoolSource.SERVER_PROPS or props is None:
        return []
    seen = backend.settings
    slots, per_slot, unified = props.total_slots, props.n_ctx_slot, seen.unified.value
    pool = per_slot if unified else per_slot * slots
    layout = "unknown" if unified is None else "unified" if unified else "split"
    what = f"KV pool {layout}: {layout_label(unified=unified, slots=slots, slot_ctx_tokens=per_slot)}"
    evidence = (f"/props total_slots {slots}, default_generation_settings.n_ctx {_tokens(per_slot)}",
                f"unified from {seen.unified.source}",
                *(f"slot {s.slot_id}: n_ctx {_tokens(s.n_ctx)}, {'busy' if s.is_processing else 'idle'}"
                  for s in backend.slots))
    data = {"slots": slots, "slot_context_tokens": per_slot, "unified": unified,
            "pool_tokens": pool if unified is not None else None}
    findings = []
    if longest.value is not None and longest.value >= per_slot:
        want = pow2_at_least(longest.value + longest.value // 8)
        c_value = want if unified else want * slots
        findings.append(Finding(
            "prompt_exceeds_slot", Severity.WARNING,
            f"{what}: prompts of {_tokens(longest.value)} tokens ({longest.source}) exceed the per-slot context",
            evidence, fix_for(Knob.CONTEXT, "llama-server", str(c_value)), backend=backend.name, data=data))
    if unified and slots > 1:
        split_c = pool if longest.value is None else max(pool, pow2_at_least(longest.value) * slots)
        findings.append(Finding(
            "unified_pool", Severity.WARNING,
            f"llama-server's unified pool: {slots} slots share {_tokens(pool)} tokens; concurrent long requests "
            "all fail at once with 'Context size has been exceeded.'", evidence,
            fix_for(Knob.SPLIT_POOL, "llama-server", f"-np {slots} -no-kvu -c {split_c}"),
            (fix_for(Knob.SPLIT_POOL, "llama-server", f"--kv-unified-per-slot {pool // slots}"),
             fix_for(Knob.PARALLEL, "llama-server", "1"),
             _kvgate_fix(backend.name)),
            backend=backend.name, data=data))
    elif unified is None and slots > 1:
        findings.append(Finding("pool_layout_unknown", Severity.INFO, f"{what}: pass the server's log to tell",
                                evidence, fix_for_log(), backend=backend.name, data=data))
    if not findings:
        findings.append(Finding("slots", Severity.OK, what, evidence, backend=backend.name, data=data))
    return findings


def _kvgate_fix(name: str) -> Fix:
    return Fix("unified_kv", "true (run kvgate in front: it admits only what fits the pool)",
               f"{KVGATE_CONFIG} name = \"{name}\"")


def fix_for_log() -> Fix:
    return Fix("--log", "the llama-server log (its 'n_slots = .., kv_unified = ..' line)", "kvgate check")
