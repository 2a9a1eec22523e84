"""Load admission and residency (pure): whether a model may load now, at what context, after which unloads.

A linear cost (4 GiB of weights + 128 KiB of KV per token: 8192 tokens -> 5 GiB, 16384 -> 6, 32768 -> 8) on a
24 GiB GPU; ``min_resident_s`` is 10 s and "now" is 100 s unless a case says otherwise.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.loads.plan import (
    CONTEXT_STEP_TOKENS,
    GpuRoom,
    LoadAction,
    LoadAsk,
    LoadDecision,
    ResidentState,
    decide_load,
    unload_candidates,
)

GIB = 1 << 30
MIB = 1 << 20
WEIGHTS = 4 * GIB
KV_PER_TOKEN = 128 * 1024
TOTAL = 24 * GIB
MIN_RESIDENT_S = 10.0
NOW_S = 100.0
INF = float("inf")
LOAD, WAIT, REFUSE = LoadAction.LOAD, LoadAction.WAIT, LoadAction.REFUSE


def load_bytes_at(context: int) -> int:
    return WEIGHTS + context * KV_PER_TOKEN


def ask(context: int, floor: int | None = None, *, model: str = "m", priority: int = 0) -> LoadAsk:
    """Asks for ``context`` tokens; the floor is the context itself unless given (no lowering)."""
    return LoadAsk(model, context, context if floor is None else floor, load_bytes_at, priority)


def room(available: int, *, headroom: int = 0, max_loaded: int | None = None, total: int = TOTAL) -> GpuRoom:
    return GpuRoom(available, total, headroom, max_loaded)


def res(
    name: str, size: int, *, active: int = 0, pinned: bool = False, priority: int = 0, used: float = -INF,
    loaded: float = -INF,
) -> ResidentState:
    return ResidentState(name, size, active, pinned, priority, used, loaded)


def decide(
    load: LoadAsk, gpu: GpuRoom, residents: Sequence[ResidentState], *, now_s: float = NOW_S, own: int = 0
) -> LoadDecision:
    return decide_load(load, gpu, residents, now_s=now_s, min_resident_s=MIN_RESIDENT_S, own_resident_bytes=own)


@dataclass(frozen=True)
class Case:
    id: str
    ask: LoadAsk
    room: GpuRoom
    residents: tuple[ResidentState, ...]
    action: LoadAction
    context: int
    unload: tuple[str, ...] = ()
    lowered_from: int | None = None
    now_s: float = NOW_S
    own: int = 0
    residents_note: str = field(default="", compare=False)


# Three idle 6 GiB models: a (priority 1, least recently used), b (priority 0, used at 50), c (priority 0, at 40).
ABC = (res("a", 6 * GIB, priority=1, used=5.0), res("b", 6 * GIB, used=50.0), res("c", 6 * GIB, used=40.0))
BUSY_IDLE = (res("busy", 10 * GIB, active=2, used=0.0), res("idle", 4 * GIB, used=90.0))
ROOM_2_3 = 2 * GIB + 300 * MIB  # + an idle 4 GiB model: 6.29 GiB -> 4 GiB + 18784 tokens -> 18688 on the grid
OVER_ESTIMATED = (res("over", 30 * GIB),)  # an estimate larger than the GPU: unloading it frees at most the cap

CASES = [
    Case("fits-now", ask(8192), room(10 * GIB), (res("x", 6 * GIB),), LOAD, 8192),
    Case("fits-after-one-unload", ask(8192, priority=1), room(2 * GIB), ABC, LOAD, 8192, ("c",)),
    Case("lowest-priority-then-lru", ask(49152, priority=1), room(2 * GIB), ABC, LOAD, 49152, ("c", "b")),
    Case("priority-before-recency", ask(98304, priority=1), room(2 * GIB), ABC, LOAD, 98304, ("c", "b", "a")),
    Case("busy-skipped-idle-unloaded", ask(8192), room(2 * GIB), BUSY_IDLE, LOAD, 8192, ("idle",)),
    Case("busy-wait", ask(32768), room(2 * GIB), BUSY_IDLE, WAIT, 32768),
    Case("pinned-refuse", ask(32768), room(2 * GIB), (res("p", 10 * GIB, pinned=True),), REFUSE, 32768),
    Case("higher-priority-refuse", ask(32768), room(2 * GIB), (res("h", 10 * GIB, priority=1),), REFUSE, 32768),
    Case("equal-priority-unloaded", ask(32768, priority=1), room(2 * GIB), (res("h", 10 * GIB, priority=1),), LOAD,
         32768, ("h",)),
    Case("young-wait", ask(32768), room(2 * GIB), (res("y", 10 * GIB, loaded=95.0),), WAIT, 32768),
    Case("young-old-enough", ask(32768), room(2 * GIB), (res("y", 10 * GIB, loaded=95.0),), LOAD, 32768, ("y",),
         now_s=105.0),
    Case("lowered", ask(32768, 2048), room(ROOM_2_3), (res("i", 4 * GIB),), LOAD, 18688, ("i",), 32768),
    Case("lowered-before-wait", ask(32768, 2048), room(ROOM_2_3), (res("i", 4 * GIB), res("b", 4 * GIB, active=1)),
         LOAD, 18688, ("i",), 32768),
    Case("floor-refuse", ask(32768, 24576), room(ROOM_2_3), (res("i", 4 * GIB),), REFUSE, 32768),
    Case("floor-wait", ask(32768, 24576), room(ROOM_2_3), (res("i", 4 * GIB), res("b", 4 * GIB, active=1)), WAIT,
         32768),
    Case("too-big-refuse", ask(229376), room(2 * GIB), (res("i", 4 * GIB),), REFUSE, 229376),
    Case("overcommitted-wait", ask(8192), room(-GIB), (res("i", 10 * GIB),), WAIT, 8192),
    Case("max-loaded-forces-unload", ask(8192), room(20 * GIB, max_loaded=2),
         (res("a", GIB, used=10.0), res("b", GIB, used=20.0)), LOAD, 8192, ("a",)),
    Case("max-loaded-room-for-one", ask(8192), room(20 * GIB, max_loaded=3),
         (res("a", GIB, used=10.0), res("b", GIB, used=20.0)), LOAD, 8192),
    Case("max-loaded-own-not-counted", ask(16384), room(15 * GIB, max_loaded=2),
         (res("m", 5 * GIB), res("a", GIB)), LOAD, 16384, own=5 * GIB),
    Case("max-loaded-pinned-refuse", ask(8192), room(20 * GIB, max_loaded=2),
         (res("a", GIB, pinned=True), res("b", GIB, priority=9)), REFUSE, 8192),
    Case("max-loaded-busy-wait", ask(8192), room(20 * GIB, max_loaded=2),
         (res("a", GIB, pinned=True), res("b", GIB, active=1)), WAIT, 8192),
    Case("headroom-exact", ask(8192), room(6 * GIB, headroom=GIB), (), LOAD, 8192),
    Case("headroom-step-over-refuse", ask(8448), room(6 * GIB, headroom=GIB), (), REFUSE, 8448),
    Case("no-headroom-step-over", ask(8448), room(6 * GIB), (), LOAD, 8448),
    Case("headroom-lowered", ask(8448, 2048), room(6 * GIB, headroom=GIB), (), LOAD, 8192, (), 8448),
    Case("cap-fits-total", ask(163840), room(4 * GIB), OVER_ESTIMATED, LOAD, 163840, ("over",)),
    Case("cap-step-over-refuse", ask(164096), room(4 * GIB), OVER_ESTIMATED, REFUSE, 164096),
    Case("cap-lowered-to-total", ask(196608, 2048), room(4 * GIB), OVER_ESTIMATED, LOAD, 163840, ("over",), 196608),
    Case("reload-own-bytes", ask(16384), room(3 * GIB), (res("m", 5 * GIB),), LOAD, 16384, own=5 * GIB),
    Case("reload-without-own-bytes", ask(16384), room(3 * GIB), (res("m", 5 * GIB),), REFUSE, 16384),
]


def run_case(case: Case) -> LoadDecision:
    return decide(case.ask, case.room, case.residents, now_s=case.now_s, own=case.own)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide_load(case: Case) -> None:
    decision = run_case(case)
    assert (decision.action, decision.context_tokens, decision.unload, decision.lowered_from) == (
        case.action, case.context, case.unload, case.lowered_from), decision.describe()
    assert decision.model == case.ask.model
    assert decision.free_bytes == case.room.available_bytes - case.room.headroom_bytes
    assert decision.load_bytes == load_bytes_at(decision.context_tokens)
    sizes = {m.name: m.resident_bytes for m in case.residents}
    assert decision.freed_bytes == sum(sizes[name] for name in decision.unload)
    if decision.action is LOAD:
        assert not decision.reason
        gpu = case.room
        have = min(gpu.available_bytes + case.own + decision.freed_bytes, gpu.total_bytes) - gpu.headroom_bytes
        assert decision.load_bytes <= have
    else:
        assert decision.reason and not decision.unload and decision.freed_bytes == 0


def test_load_plan_matrix_prints() -> None:
    """The cases as a table (run with -s to read it): scenario -> action, context, unload."""
    rows = [f"{'scenario':<28} {'asked':>7} {'floor':>6} {'avail':>6} {'action':<7} {'context':>7} {'lowered':>7} "
            f"{'unload':<10} {'GiB':>6}"]
    for case in CASES:
        d = run_case(case)
        rows.append(f"{case.id:<28} {case.ask.context_tokens:>7} {case.ask.floor_context_tokens:>6} "
                    f"{case.room.available_bytes / GIB:>6.2f} {d.action:<7} {d.context_tokens:>7} "
                    f"{d.lowered_from or '-':>7} {','.join(d.unload) or '-':<10} {d.load_bytes / GIB:>6.2f}")
    print("\n".join(rows))
    assert len(rows) == len(CASES) + 1
    assert {run_case(c).action for c in CASES} == {LOAD, WAIT, REFUSE}


def test_lowered_context_is_the_largest_step_that_fits() -> None:
    residents = (res("i", 4 * GIB),)
    lowered = decide(ask(32768, 2048), room(ROOM_2_3), residents)
    assert lowered.action is LOAD and lowered.lowered_from == 32768
    context = lowered.context_tokens
    assert context % CONTEXT_STEP_TOKENS == 0 and context == 18688
    # the numbers: it fits, one step more does not
    assert load_bytes_at(context) <= ROOM_2_3 + 4 * GIB < load_bytes_at(context + CONTEXT_STEP_TOKENS)
    # and decide_load agrees when asked for exactly those contexts with no lowering allowed
    assert decide(ask(context), room(ROOM_2_3), residents).action is LOAD
    assert decide(ask(context + CONTEXT_STEP_TOKENS), room(ROOM_2_3), residents).action is REFUSE
    assert "context lowered from 32768 tokens" in lowered.describe()


def test_lowered_context_never_below_the_floor() -> None:
    residents = (res("i", 4 * GIB),)
    at_floor = decide(ask(32768, 18688), room(ROOM_2_3), residents)
    assert (at_floor.action, at_floor.context_tokens) == (LOAD, 18688)
    above = decide(ask(32768, 18689), room(ROOM_2_3), residents)  # the next step up (18944) does not fit
    assert above.action is REFUSE and above.context_tokens == 32768 and above.lowered_from is None


def test_only_as_many_unloaded_as_needed() -> None:
    gpu = room(2 * GIB)
    for context, unload in [(8192, ("c",)), (49152, ("c", "b")), (98304, ("c", "b", "a"))]:
        decision = decide(ask(context, priority=1), gpu, ABC)
        assert decision.unload == unload
        sizes = {m.name: m.resident_bytes for m in ABC}
        one_fewer = sum(sizes[n] for n in unload[:-1])
        assert load_bytes_at(context) > gpu.available_bytes + one_fewer  # the last unload was needed
    assert decide(ask(229376, priority=1), gpu, ABC).action is REFUSE


def test_unload_candidates_order_and_classes() -> None:
    residents = [
        res("self", GIB),  # the model asked for: never a candidate
        res("pinned", GIB, pinned=True),
        res("higher", GIB, priority=2),
        res("busy", GIB, active=1),
        res("young", GIB, loaded=95.0),
        res("old-p1", GIB, priority=1, used=1.0, loaded=0.0),
        res("lru", GIB, used=10.0),
        res("mru", GIB, used=80.0),
        res("just-old-enough", GIB, used=50.0, loaded=90.0),
    ]
    now_free, later = unload_candidates(residents, ask(8192, model="self", priority=1), NOW_S, MIN_RESIDENT_S)
    assert [m.name for m in now_free] == ["lru", "just-old-enough", "mru", "old-p1"]
    assert [m.name for m in later] == ["busy", "young"]


def test_hysteresis_waits_until_min_resident_then_unloads() -> None:
    residents = (res("y", 10 * GIB, loaded=95.0),)
    actions = {}
    for tenth in range(950, 1101):
        now_s = tenth / 10
        decision = decide(ask(32768), room(2 * GIB), residents, now_s=now_s)
        actions[now_s] = (decision.action, decision.unload)
    assert all(a == (WAIT, ()) for t, a in actions.items() if t < 105.0)
    assert all(a == (LOAD, ("y",)) for t, a in actions.items() if t >= 105.0)
    wait = decide(ask(32768), room(2 * GIB), residents, now_s=100.0)
    assert "y" in wait.reason


def test_alternating_models_swap_at_most_once_per_min_resident() -> None:
    """A and B (14 GiB each) do not fit together on 24 GiB; requests alternate every 0.25 s for 100 s."""
    duration_s, step_s, each = 100.0, 0.25, 14 * GIB
    context = (each - WEIGHTS) // KV_PER_TOKEN
    resident: dict[str, ResidentState] = {}
    swap_times: list[float] = []
    waits = 0
    for i in range(int(duration_s / step_s)):
        now_s = i * step_s
        name = "A" if i % 2 == 0 else "B"
        if name in resident:
            resident[name] = dataclasses.replace(resident[name], last_used_s=now_s)
            continue
        available = TOTAL - sum(m.resident_bytes for m in resident.values())
        decision = decide(ask(context, model=name), room(available), list(resident.values()), now_s=now_s)
        assert decision.action is not REFUSE, decision.describe()
        if decision.action is WAIT:
            waits += 1
            continue
        for gone in decision.unload:
            del resident[gone]
        resident[name] = res(name, decision.load_bytes, used=now_s, loaded=now_s)
        assert sum(m.resident_bytes for m in resident.values()) <= TOTAL
        if decision.unload:
            swap_times.append(now_s)
    assert len(swap_times) <= duration_s / MIN_RESIDENT_S + 1
    assert len(swap_times) >= duration_s / MIN_RESIDENT_S - 1  # it does swap, once each interval
    assert all(b - a >= MIN_RESIDENT_S for a, b in itertools.pairwise(swap_times))
    assert waits > 0
    # without hysteresis it would swap on every request
    resident.clear()
    swaps = 0
    for i in range(40):
        name = "A" if i % 2 == 0 else "B"
        available = TOTAL - sum(m.resident_bytes for m in resident.values())
        decision = decide_load(ask(context, model=name), room(available), list(resident.values()), now_s=i * step_s,
                               min_resident_s=0.0)
        assert decision.action is LOAD
        for gone in decision.unload:
            del resident[gone]
        resident[name] = res(name, decision.load_bytes, loaded=i * step_s)
        swaps += bool(decision.unload)
    assert swaps == 39


def test_refuse_reason_and_describe_name_the_numbers() -> None:
    decision = decide(ask(229376, model="big:70b"), room(2 * GIB), (res("i", 4 * GIB),))
    assert decision.action is REFUSE
    assert "229376 tokens" in decision.reason and "32.00 GiB" in decision.reason and "6.00 GiB" in decision.reason
    text = decision.describe()
    assert "'big:70b'" in text and "32.00 GiB" in text and "2.00 GiB free" in text and decision.reason in text
    pinned = decide(ask(32768), room(2 * GIB, headroom=GIB), (res("p", 10 * GIB, pinned=True),))
    assert pinned.action is REFUSE and "1.00 GiB free" in pinned.describe() and "8.00 GiB" in pinned.describe()
    assert "at most 1.00 GiB" in pinned.reason


def test_describe_a_load_with_unloads() -> None:
    decision = decide(ask(49152, priority=1), room(2 * GIB), ABC)
    text = decision.describe()
    assert "'m'" in text and "10.00 GiB" in text and "fits (2.00 GiB free)" in text
    assert "after unloading c, b (12.00 GiB)" in text and "lowered" not in text


def test_overcommitted_waits_even_when_an_unload_would_make_room() -> None:
    decision = decide(ask(8192), room(-GIB), (res("i", 10 * GIB),))
    assert decision.action is WAIT and "over-committed by 1.00 GiB" in decision.reason
    assert "0.00 GiB free" in decision.describe()


def test_max_loaded_refuse_reason() -> None:
    decision = decide(ask(8192), room(20 * GIB, max_loaded=2), (res("a", GIB, pinned=True), res("b", GIB, pinned=True)))
    assert decision.action is REFUSE
    assert "2 models are loaded" in decision.reason and "the most the backend keeps is 2" in decision.reason


def test_floor_above_the_context_is_the_context() -> None:
    decision = decide(ask(8192, 65536), room(10 * GIB), ())
    assert (decision.action, decision.context_tokens, decision.lowered_from) == (LOAD, 8192, None)


def test_a_floor_off_the_grid_counts_as_the_next_step_up() -> None:
    """Lowered contexts are multiples of 256, so a floor of 1000 tokens is one of 1024: when 1000 would fit but 1024
    does not, the answer is a REFUSE that says 1024 (not "needs 4.12 GiB, 4.12 GiB can be had"), and never a WAIT
    that turns into a REFUSE once the busy model is gone."""
    gpu = room(load_bytes_at(1000))
    refused = decide(ask(4096, 1000), gpu, ())
    assert refused.action is REFUSE and "floor context of 1024 tokens" in refused.reason
    busy = (res("busy", GIB, active=1),)
    tight = room(load_bytes_at(1000) - GIB)
    for floor, context in [(1000, 4096), (900, 1000), (100, 4096)]:
        room_at_floor = room(load_bytes_at(floor) - GIB)
        for gpu_now in (tight, room_at_floor):
            first = decide(ask(context, floor), gpu_now, busy)
            if first.action is WAIT:  # then it must load once the busy model is done
                assert decide(ask(context, floor), gpu_now, settled(busy)).action is LOAD, (floor, context)
    assert decide(ask(4096, 1000), room(load_bytes_at(1024)), ()).context_tokens == 1024


# Properties over random GPUs: every LOAD fits and unloads only candidates; a WAIT turns into a LOAD once the busy
# and young models are done; a REFUSE is not a LOAD even at the floor with every unpinned lower model idle and old.

NAMES = ["a", "b", "c", "d"]
resident_st = st.builds(
    ResidentState,
    name=st.sampled_from(NAMES),
    resident_bytes=st.integers(0, 12).map(lambda g: g * GIB),
    active_sequences=st.sampled_from([0, 0, 1]),
    pinned=st.booleans(),
    priority=st.integers(0, 2),
    last_used_s=st.floats(0, 100),
    loaded_at_s=st.sampled_from([-INF, 50.0, 95.0]),
)


def grid_floor(context: int, floor: int) -> int:
    """The lowest context a lowering may reach: the floor rounded up to the 256-token grid, at most the context."""
    step = CONTEXT_STEP_TOKENS
    return min(context, max(step, -(-floor // step) * step))


def settled(residents: Sequence[ResidentState]) -> list[ResidentState]:
    return [dataclasses.replace(m, active_sequences=0, loaded_at_s=-INF) for m in residents]


@settings(max_examples=400, deadline=None)
@given(
    residents=st.lists(resident_st, max_size=4, unique_by=lambda m: m.name),
    available_gib=st.integers(-2, 24),
    headroom_gib=st.integers(0, 2),
    max_loaded=st.sampled_from([None, 1, 2, 3]),
    context=st.integers(1, 160).map(lambda k: k * 1024),
    floor=st.one_of(st.integers(1, 160).map(lambda k: k * 512), st.integers(1, 81920)),
    priority=st.integers(0, 2),
)
def test_decisions_are_consistent(
    residents: list[ResidentState], available_gib: int, headroom_gib: int, max_loaded: int | None, context: int,
    floor: int, priority: int,
) -> None:
    load = ask(context, floor, model="m", priority=priority)
    gpu = room(available_gib * GIB, headroom=headroom_gib * GIB, max_loaded=max_loaded)
    decision = decide(load, gpu, residents)
    now_free, _ = unload_candidates(residents, load, NOW_S, MIN_RESIDENT_S)
    if available_gib < 0:
        assert decision.action is WAIT
        return
    if decision.action is LOAD:
        assert min(floor, context) <= decision.context_tokens <= context
        if decision.context_tokens < context:
            assert decision.lowered_from == context and decision.context_tokens % CONTEXT_STEP_TOKENS == 0
            assert decide(ask(decision.context_tokens + CONTEXT_STEP_TOKENS, priority=priority), gpu,
                          residents).action is not LOAD
        assert set(decision.unload) <= {m.name for m in now_free}
        have = min(gpu.available_bytes + decision.freed_bytes, TOTAL) - gpu.headroom_bytes
        assert decision.load_bytes <= have
        if max_loaded is not None:
            assert len(residents) - len(decision.unload) + 1 <= max_loaded
    elif decision.action is WAIT:
        assert decide(load, gpu, settled(residents)).action is LOAD
    else:
        floor_only = ask(grid_floor(context, floor), priority=priority)
        assert decide(floor_only, gpu, settled(residents)).action is not LOAD
