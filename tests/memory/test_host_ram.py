"""System RAM from /proc/meminfo, and what a partly offloaded load puts there (issue 12 point 5)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gateway.memory.fit_estimate import VramRoom, estimate
from gateway.memory.host_ram import (
    FIT_TARGET_BYTES,
    HostRam,
    HostRamUnavailable,
    RamVerdict,
    offload,
    parse_meminfo,
    ram_check,
    ram_verdict,
    read_host_ram,
)
from gateway.memory.presets import preset_profile

GIB = 1 << 30
SAMPLE = """MemTotal:       65536000 kB
MemFree:         1024000 kB
MemAvailable:   32768000 kB
Buffers:          102400 kB
Cached:         30000000 kB
SwapCached:            0 kB
SwapTotal:       8388604 kB
SwapFree:        4194302 kB
HugePages_Total:       0
"""


def test_parse_meminfo_gives_bytes() -> None:
    assert parse_meminfo(SAMPLE) == HostRam(
        total_bytes=65536000 * 1024, available_bytes=32768000 * 1024,
        swap_total_bytes=8388604 * 1024, swap_free_bytes=4194302 * 1024,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SAMPLE.replace("MemAvailable:", "MemAvail:"), "no MemAvailable"),
        ("MemTotal: 1 kB\n", "no MemAvailable, SwapTotal, SwapFree"),
        (SAMPLE.replace("SwapFree:        4194302 kB", "SwapFree: lots kB"), "cannot read SwapFree"),
        ("", "no MemTotal"),
    ],
)
def test_missing_or_malformed_fields_are_named(text: str, expected: str) -> None:
    with pytest.raises(HostRamUnavailable, match=expected):
        parse_meminfo(text)


def test_reader_reads_a_file_and_says_when_it_cannot(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(SAMPLE)
    assert read_host_ram(meminfo).available_bytes == 32768000 * 1024
    with pytest.raises(HostRamUnavailable, match="Linux only"):
        read_host_ram(tmp_path / "absent")


HOST = HostRam(total_bytes=64 * GIB, available_bytes=32 * GIB, swap_total_bytes=8 * GIB, swap_free_bytes=4 * GIB)


@pytest.mark.parametrize(
    ("ram", "verdict"),
    [
        (0, RamVerdict.FITS),
        (31 * GIB, RamVerdict.FITS),  # available - 1 GiB headroom: inclusive
        (31 * GIB + 1, RamVerdict.WOULD_SWAP),
        (36 * GIB, RamVerdict.WOULD_SWAP),  # available + swap free: inclusive
        (36 * GIB + 1, RamVerdict.WOULD_OOM),
    ],
)
def test_verdict_boundaries(ram: int, verdict: RamVerdict) -> None:
    assert ram_verdict(ram, HOST) is verdict


def test_nothing_spilled_fits_even_on_a_full_host() -> None:
    assert ram_verdict(0, replace(HOST, available_bytes=0)) is RamVerdict.FITS
    with pytest.raises(ValueError, match="must be >= 0"):
        ram_verdict(-1, HOST)


def test_ram_cost_of_a_partial_offload_table() -> None:
    """llama3.1:8b (32 layers) at 128K x 2 sequences on GPUs of several sizes: what spills to system RAM."""
    profile = preset_profile("llama3.1:8b")
    full = estimate(profile, context=131072, parallel=2)
    cost = full.cost
    layered = cost.weights_bytes + cost.kv_bytes
    fixed = cost.compute_bytes + cost.output_bytes + cost.overhead_bytes
    half_vram = FIT_TARGET_BYTES + fixed + layered // 2  # room for exactly half the layers
    rows = [  # vram, expected cpu layers
        (None, None),
        (64 * GIB, 0),  # fits: nothing offloaded
        (half_vram, 16),
        (fixed, 32),  # no room for any layer
    ]
    print(f"\n{'VRAM GiB':>9} {'gpu':>4} {'cpu':>4} {'RAM GiB':>8}  verdict on a 32 GiB-available host")
    for vram, cpu_layers in rows:
        result = estimate(profile, context=131072, parallel=2, vram=VramRoom(total_bytes=vram, free_bytes=vram))
        spill = offload(result)
        if cpu_layers is None:
            assert spill is None
            assert ram_check(result, lambda: HOST).ram_bytes is None
            continue
        assert vram is not None and spill is not None and spill.cpu_layers == cpu_layers and spill.n_layers == 32
        assert spill.ram_bytes == pytest.approx(layered * cpu_layers / 32, abs=1)
        check = ram_check(result, lambda: HOST)
        print(f"{vram / GIB:>9.2f} {spill.gpu_layers:>4} {spill.cpu_layers:>4} {spill.ram_bytes / GIB:>8.2f}  "
              f"{check.verdict}")
        assert check.verdict is ram_verdict(spill.ram_bytes, HOST)
    half = offload(
        estimate(profile, context=131072, parallel=2, vram=VramRoom(total_bytes=half_vram, free_bytes=half_vram))
    )
    assert half is not None  # about half the weights plus half the KV
    assert half.ram_bytes == pytest.approx(cost.weights_bytes / 2 + cost.kv_bytes / 2, rel=1e-6)


def test_ram_check_json_and_an_unreadable_host() -> None:
    profile = preset_profile("llama3.1:8b")
    fits = estimate(profile, context=8192, vram=VramRoom(total_bytes=24 * GIB, free_bytes=24 * GIB))
    assert ram_check(fits, lambda: HOST).to_json() == {"ram_bytes": 0}
    spills = estimate(profile, context=131072, parallel=2, vram=VramRoom(total_bytes=24 * GIB, free_bytes=24 * GIB))
    small = replace(HOST, available_bytes=4 * GIB, swap_free_bytes=0)
    body = ram_check(spills, lambda: small).to_json()
    assert body["ram_verdict"] == "would_oom" and body["ram_available_bytes"] == 4 * GIB
    assert "same host" in body["ram_note"] and body["gpu_layers"] + body["cpu_layers"] == 32
    assert "OOM killer" in str(ram_check(spills, lambda: small).warning())

    def unreadable() -> HostRam:
        raise HostRamUnavailable("cannot read /proc/meminfo: gone")

    body = ram_check(spills, unreadable).to_json()
    assert body["ram_bytes"] > 0 and body["ram_verdict"] is None and "gone" in body["ram_note"]


async def test_estimate_cli_prints_the_ram_line_when_it_offloads() -> None:
    import io

    from gateway.cli import estimate as estimate_cli
    from gateway.cli.main import build_parser

    def run_args(*extra: str) -> list[str]:
        return ["estimate", "llama3.1:8b", "--context", "131072", "--vram", "24GiB", *extra]

    out = io.StringIO()
    await estimate_cli.run(build_parser().parse_args(run_args("--parallel", "2")), out=out)
    assert "system RAM:" in out.getvalue() and "layers offloaded to the CPU" in out.getvalue()
    fits = io.StringIO()
    assert await estimate_cli.run(build_parser().parse_args(run_args()), out=fits) == 0
    assert "system RAM:" not in fits.getvalue()
