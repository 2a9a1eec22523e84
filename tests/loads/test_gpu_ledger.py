"""The GPU ledger (pure): budgets from a reading, resident models and reservations; whether a load fits."""

from __future__ import annotations

import pytest

from gateway.loads.gpu_ledger import (
    FitVerdict,
    GpuBoard,
    GpuBudget,
    GpuEntry,
    LoadFit,
    LoadReservations,
    ResidentModel,
    SizeSource,
    build_budget,
    estimated_resident,
    fits_load,
    plan_load,
    reported_resident,
)
from gateway.memory.load_cost import estimate_load_cost
from gateway.memory.presets import preset_profile
from gateway.memory.sources.ollama_answers import LoadedModel
from gateway.memory.vram import DeviceMemory, VramReading

GIB = 1 << 30
REPORTED, ESTIMATED = SizeSource.REPORTED, SizeSource.ESTIMATED


def reading(*devices: tuple[int, int]) -> VramReading:
    """Devices as (total GiB, used GiB)."""
    return VramReading(
        devices=tuple(DeviceMemory(i, f"gpu{i}", "", t * GIB, u * GIB, (t - u) * GIB) for i, (t, u) in
                      enumerate(devices)),
        processes=(), taken_at_s=0.0, source="exporter",
    )


def model(name: str, gib: int, source: SizeSource = REPORTED) -> ResidentModel:
    return ResidentModel(name, gib * GIB, source)


@pytest.mark.parametrize(
    ("devices", "residents", "reserved_gib", "other_gib", "free_gib", "overcommitted"),
    [
        pytest.param([(24, 0)], [], 0, 0, 24, False, id="idle-gpu"),
        pytest.param([(24, 6)], [model("a", 6)], 0, 0, 18, False, id="reported-model-is-all-used"),
        pytest.param([(24, 14)], [model("a", 6)], 0, 8, 10, False, id="foreign-process-is-other"),
        pytest.param([(24, 5)], [model("a", 6, ESTIMATED)], 0, 0, 18, False, id="estimate-above-reading-not-negative"),
        pytest.param([(24, 6)], [model("a", 6)], 4, 0, 14, False, id="reservation-takes-from-free"),
        pytest.param([(24, 20)], [model("a", 6)], 8, 14, 0, True, id="reservation-beyond-free-overcommits"),
        pytest.param([(24, 12)], [model("a", 6), model("b", 20, ESTIMATED)], 0, 0, 0, True,
                     id="estimates-beyond-total-overcommit"),
        pytest.param([(24, 6), (24, 10)], [model("a", 12)], 0, 4, 32, False, id="two-devices-summed"),
    ],
)
def test_budget(
    devices: list[tuple[int, int]], residents: list[ResidentModel], reserved_gib: int, other_gib: int, free_gib: int,
    overcommitted: bool,
) -> None:
    budget = build_budget("gpu0", reading(*devices), residents, reserved_gib * GIB)
    assert budget.total_bytes == sum(t for t, _ in devices) * GIB and budget.devices == len(devices)
    assert budget.other_processes_bytes == other_gib * GIB
    assert budget.free_bytes == free_gib * GIB
    assert budget.overcommitted is overcommitted
    assert budget.resident_bytes == sum(m.resident_bytes for m in residents)
    if not overcommitted:
        assert budget.resident_bytes + budget.other_processes_bytes + budget.reserved_bytes + budget.free_bytes \
            == budget.total_bytes


def test_reported_size_is_size_vram_and_estimate_has_its_parts() -> None:
    loaded = LoadedModel("qwen2.5:7b", "d", size_bytes=8 * GIB, size_vram_bytes=6 * GIB, context_tokens=8192,
                         expires_at=None, quantization=None)
    assert reported_resident(loaded) == ResidentModel("qwen2.5:7b", 6 * GIB, REPORTED)
    cost = estimate_load_cost(preset_profile("llama3.1:8b"), context_tokens=8192, parallel=1)
    estimated = estimated_resident("llama3.1:8b", cost)
    assert estimated.source is ESTIMATED and estimated.resident_bytes == cost.total_bytes
    assert (estimated.weights_bytes, estimated.kv_bytes, estimated.compute_bytes) == (
        cost.weights_bytes, cost.kv_bytes, cost.compute_bytes)
    assert estimated.kv_bytes == GIB  # 128 KiB/token x 8192


def test_negative_reservation_is_refused() -> None:
    with pytest.raises(ValueError, match="reserved is -1 bytes"):
        build_budget("gpu0", reading((24, 0)), [], -1)


# 24 GiB GPU: a (6 GiB), b (4 GiB), c (2 GiB) resident, 2 GiB other, 1 GiB reserved -> 9 GiB available
BUSY: GpuBudget = build_budget("gpu0", reading((24, 14)), [model("a", 6), model("b", 4), model("c", 2)], GIB)

FITS_CASES = [
    # load, headroom, idle (unload order) -> verdict, unload, freed, short by (GiB)
    (8, 1, (), FitVerdict.FITS, (), 0, 0),
    (9, 1, (), FitVerdict.DOES_NOT_FIT, (), 0, 1),
    (9, 1, ("c",), FitVerdict.FITS_AFTER_UNLOADING, ("c",), 2, 0),
    (14, 1, ("c", "b", "a"), FitVerdict.FITS_AFTER_UNLOADING, ("c", "b"), 6, 0),
    (14, 1, ("a", "c"), FitVerdict.FITS_AFTER_UNLOADING, ("a",), 6, 0),
    (14, 1, ("zzz", "c", "c", "b"), FitVerdict.FITS_AFTER_UNLOADING, ("c", "b"), 6, 0),
    (30, 0, ("a", "b", "c"), FitVerdict.DOES_NOT_FIT, (), 0, 9),
    (0, 0, (), FitVerdict.FITS, (), 0, 0),
]


@pytest.mark.parametrize(("load", "headroom", "idle", "verdict", "unload", "freed", "short"), FITS_CASES)
def test_fits_load(
    load: int, headroom: int, idle: tuple[str, ...], verdict: FitVerdict, unload: tuple[str, ...], freed: int,
    short: int,
) -> None:
    fit = fits_load(BUSY, load * GIB, headroom * GIB, idle)
    assert fit == LoadFit(verdict, load * GIB, headroom * GIB, (9 - headroom) * GIB, unload, freed * GIB,
                          short * GIB)


def test_fits_load_matrix_prints() -> None:
    """The cases as a small table (run with -s to read it)."""
    rows = [f"{'load':>5} {'head':>5} {'idle':<14} {'verdict':<21} {'unload':<8} {'short':>5}"]
    for load, headroom, idle, *_ in FITS_CASES:
        fit = fits_load(BUSY, load * GIB, headroom * GIB, idle)
        rows.append(f"{load:>5} {headroom:>5} {','.join(idle) or '-':<14} {fit.verdict:<21} "
                    f"{','.join(fit.unload) or '-':<8} {fit.short_by_bytes // GIB:>5}")
    print("\n".join(rows))
    assert len(rows) == len(FITS_CASES) + 1


def test_an_overcommitted_gpu_fits_nothing_without_unloading() -> None:
    over = build_budget("gpu0", reading((24, 24)), [model("a", 20)], 8 * GIB)
    assert over.overcommitted and over.available_bytes == -8 * GIB and over.free_bytes == 0
    assert fits_load(over, 0, 0).verdict is FitVerdict.DOES_NOT_FIT
    assert fits_load(over, GIB, 0, ["a"]) == LoadFit(FitVerdict.FITS_AFTER_UNLOADING, GIB, 0, -8 * GIB, ("a",),
                                                       20 * GIB)


@pytest.mark.parametrize(("load", "headroom"), [(-1, 0), (0, -1)])
def test_fits_load_refuses_negative_sizes(load: int, headroom: int) -> None:
    with pytest.raises(ValueError, match="neither can be negative"):
        fits_load(BUSY, load, headroom)


PLAN_CASES = [
    # available, load, candidates (name, GiB), headroom, cap -> verdict, available after headroom/cap, unload, freed,
    # short by (GiB)
    pytest.param(10, 13, [("a", 1), ("b", 2), ("c", 4)], 1, None,
                 FitVerdict.FITS_AFTER_UNLOADING, 9, ("a", "b", "c"), 7, 0, id="headroom-unloads-in-order"),
    pytest.param(20, 22, [("a", 4)], 0, 24, FitVerdict.FITS_AFTER_UNLOADING, 20, ("a",), 4, 0, id="under-the-cap"),
    pytest.param(30, 25, [("a", 4), ("b", 4)], 0, 24, FitVerdict.DOES_NOT_FIT, 24, (), 0, 1,
                 id="cap-bounds-room-and-unloading"),
]


@pytest.mark.parametrize(("available", "load", "candidates", "headroom", "cap", "verdict", "room", "unload", "freed",
                          "short"), PLAN_CASES)
def test_plan_load(
    available: int, load: int, candidates: list[tuple[str, int]], headroom: int, cap: int | None,
    verdict: FitVerdict, room: int, unload: tuple[str, ...], freed: int, short: int,
) -> None:
    fit = plan_load(available * GIB, load * GIB, [(n, g * GIB) for n, g in candidates], headroom * GIB,
                    None if cap is None else cap * GIB)
    assert fit == LoadFit(verdict, load * GIB, headroom * GIB, room * GIB, unload, freed * GIB, short * GIB)


def test_load_reservations_release_exactly_once_per_backend() -> None:
    loads = LoadReservations()
    a = loads.reserve("gpu0", "a", 3 * GIB)
    b = loads.reserve("gpu0", "b", 2 * GIB)
    other = loads.reserve("gpu1", "a", GIB)
    assert loads.reserved_bytes("gpu0") == 5 * GIB and loads.reserved_bytes("gpu1") == GIB
    assert loads.release(a) is True
    assert loads.release(a) is False
    assert loads.reserved_bytes("gpu0") == 2 * GIB and loads.reservations("gpu0") == (b,)
    stranger = LoadReservations().reserve("gpu0", "b", 2 * GIB)  # same id, another ledger
    assert loads.release(stranger) is False and loads.reserved_bytes("gpu0") == 2 * GIB
    assert loads.release(b) and loads.release(other)
    assert loads.reserved_bytes("gpu0") == 0 and loads.reservations("gpu1") == ()
    with pytest.raises(ValueError, match="must be >= 0"):
        loads.reserve("gpu0", "a", -1)


def test_board_keeps_the_last_entry_per_backend() -> None:
    board = GpuBoard()
    board.put("gpu0", GpuEntry(None, "exporter down"))
    board.put("gpu0", GpuEntry(BUSY))
    entries = board.entries()
    assert entries == {"gpu0": GpuEntry(BUSY)}
    entries.clear()
    assert board.entries()  # a copy: readers cannot change the board
