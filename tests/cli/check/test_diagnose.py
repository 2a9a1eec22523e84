"""The pure parts: findings from readings, settings from a log, exit codes."""

from __future__ import annotations

import pytest

from gateway.admission import PoolSpec
from gateway.cli.check.backend_log import parse_backend_log
from gateway.cli.check.diagnose import cache_findings, host_findings
from gateway.cli.check.diagnose_context import pool_findings
from gateway.cli.check.fixes import Finding, Severity
from gateway.cli.check.readings import BackendReadings, BackendSettingsSeen, HostReadings, Known, unknown
from gateway.cli.check.report import exit_code
from gateway.domain import BackendKind
from gateway.memory.host_ram import HostRam
from gateway.memory.sources.llama_server_answers import ServerProps
from gateway.observability.pool_layout import pool_label

GIB = 1 << 30
LLAMA_LOG = """\
llama_context: flash_attn            = enabled
llama_kv_cache: size =    1.00 MiB (  4096 cells,   2 layers,  4/1 seqs), K (q8_0):    0.50 MiB, V (q8_0):    0.50 MiB
srv    load_model: initializing, n_slots = 4, n_ctx_slot = 4096, kv_unified = 'true'
slot update_slots: id  0 | task 7 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 3100
"""
OLLAMA_LOG = ('time=2026 level=INFO source=routes.go msg="server config" env="map[OLLAMA_CONTEXT_LENGTH:32768 '
              'OLLAMA_FLASH_ATTENTION:true OLLAMA_KV_CACHE_TYPE:q8_0 OLLAMA_MAX_LOADED_MODELS:0 '
              'OLLAMA_NUM_PARALLEL:4]"')


def test_llama_server_log_settings() -> None:
    seen = parse_backend_log(LLAMA_LOG)
    assert (seen.n_slots, seen.n_ctx_slot, seen.kv_unified) == (4, 4096, True)
    assert (seen.type_k, seen.type_v, seen.flash_attn, seen.longest_prompt_tokens) == ("q8_0", "q8_0", True, 3100)


def test_ollama_log_settings() -> None:
    seen = parse_backend_log(OLLAMA_LOG)
    assert seen.ollama_env["OLLAMA_NUM_PARALLEL"] == "4"
    assert (seen.type_k, seen.flash_attn) == ("q8_0", True)


@pytest.mark.parametrize(("available_gib", "swap_free_gib", "severity"), [
    (30, 8, Severity.OK), (2.5, 8, Severity.WARNING), (1, 8, Severity.CRITICAL), (30, 2, Severity.WARNING),
])
def test_system_ram(available_gib: float, swap_free_gib: float, severity: Severity) -> None:
    ram = HostRam(32 * GIB, int(available_gib * GIB), 8 * GIB, int(swap_free_gib * GIB))
    (finding, *_) = host_findings(HostReadings(ram=ram, kernel_source="dmesg"), ())
    assert finding.severity is severity
    assert (finding.fix is None) is (severity is Severity.OK)


def test_kernel_log_unreadable_is_a_note_and_oom_lines_are_critical() -> None:
    notes = host_findings(HostReadings(ram_problem="x", kernel_problem="dmesg: Operation not permitted"), ())
    assert [f.code for f in notes] == ["system_ram_unknown", "kernel_log_unreadable"]
    killed = host_findings(HostReadings(ram_problem="x", kernel_oom_lines=("Out of memory: Killed process 9 (ollama)",),
                                        kernel_source="dmesg"), ())
    assert killed[-1].code == "oom_killer" and killed[-1].severity is Severity.CRITICAL


def _llama(unified: Known[bool], slots: int = 4, per_slot: int = 16384) -> BackendReadings:
    props = ServerProps(per_slot, slots, "m.gguf", "", "", False)
    seen = BackendSettingsSeen(unified=unified)
    return BackendReadings("cpp", "llama-server", "http://x", props=props, settings=seen)


def test_unified_pool_names_the_split_and_kvgate() -> None:
    (finding,) = pool_findings(_llama(Known(True, "log")), unknown())
    assert finding.code == "unified_pool" and "4 slots share 16,384 tokens" in finding.what
    assert finding.fix is not None and finding.fix.value == "-np 4 -no-kvu -c 16384"
    assert [alt.setting for alt in finding.alternatives] == ["-np N -no-kvu (split slots)", "-np", "unified_kv"]


def test_prompt_longer_than_a_split_slot() -> None:
    (finding,) = pool_findings(_llama(Known(False, "log"), per_slot=2048), Known(3000, "--prompt-tokens"))
    assert finding.code == "prompt_exceeds_slot" and finding.fix is not None and finding.fix.value == str(4096 * 4)


def test_quantized_v_without_flash_attention_is_critical() -> None:
    seen = BackendSettingsSeen(type_k=Known("q8_0", "log"), type_v=Known("q8_0", "log"),
                               flash_attn=Known(False, "log"))
    (finding,) = cache_findings(BackendReadings("o", "ollama", "http://x", settings=seen))
    assert finding.severity is Severity.CRITICAL and finding.fix is not None
    assert (finding.fix.setting, finding.fix.value) == ("OLLAMA_FLASH_ATTENTION", "1")


@pytest.mark.parametrize(("severities", "code"), [
    ((), 0), ((Severity.OK, Severity.INFO), 0), ((Severity.WARNING, Severity.OK), 1), ((Severity.CRITICAL,), 2),
])
def test_exit_code(severities: tuple[Severity, ...], code: int) -> None:
    assert exit_code([Finding("x", s, "x") for s in severities]) == code


@pytest.mark.parametrize(("unified", "slots", "said"), [
    (Known(True, "log"), 1, "KV pool unified: 16,384 cells shared by 1 slot"),
    (Known(False, "log"), 4, "KV pool split: 4 slots x 16,384 tokens"),
    (Known(None, "unknown"), 4, "KV pool unknown: 4 slots of 16,384 tokens, layout unknown"),
])
def test_the_pool_is_named_as_what_it_is(unified: Known[bool], slots: int, said: str) -> None:
    """A unified pool's slots share its cells: never '4 x 16,384 tokens' (the status page says the same)."""
    findings = pool_findings(_llama(unified, slots=slots), unknown())
    assert findings[0].what == said or findings[0].what.startswith(said), findings[0].what


@pytest.mark.parametrize(("spec", "label"), [
    (PoolSpec.unified_pool("b", "m", pool_tokens=2048, slots=4), "2,048 cells shared by 4 slots"),
    (PoolSpec.unified_pool("b", "m", pool_tokens=16384, slots=4, slot_ctx_tokens=4096),
     "16,384 cells shared by 4 slots, at most 4,096 per sequence"),
    (PoolSpec.split_pool("b", "m", BackendKind.OLLAMA, slot_ctx_tokens=8192, slots=2), "2 slots x 8,192 tokens"),
    (PoolSpec.split_pool("b", "m", BackendKind.OLLAMA, slot_ctx_tokens=8192, slots=1), "1 slot x 8,192 tokens"),
])
def test_status_pool_labels(spec: PoolSpec, label: str) -> None:
    assert pool_label(spec) == label
