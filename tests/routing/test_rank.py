"""The pure ranking of backends that serve one model (gateway/routing/rank.py), table-driven, with the matrix
printed (pytest -s)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.dialects import parse
from gateway.domain import Dialect, Operation, ParsedRequest
from gateway.routing.outages import Outages
from gateway.routing.rank import CandidateView, LoadCost, Standing, rank
from gateway.routing.sticky import StickyMap, conversation_key
from tests.support.clock import FakeClock

V = CandidateView


def room(name: str, **more: Any) -> CandidateView:
    return CandidateView(name, **{"slots": 2, "free_tokens": 4096, **more})


def full(name: str, waiting: int = 0, **more: Any) -> CandidateView:
    return CandidateView(name, **{"slots": 2, "busy": 2, "waiting": waiting, "free_tokens": 0, **more})


def cold(name: str, **more: Any) -> CandidateView:
    return CandidateView(name, resident=False, **{"load": LoadCost(load_s=3.0), **more})


CASES: list[tuple[str, list[CandidateView], str | None, list[str]]] = [
    ("most free KV first", [room("a"), room("b", free_tokens=8192)], None, ["b", "a"]),
    ("ties keep config order", [room("a"), room("b")], None, ["a", "b"]),
    ("room beats full", [full("a"), room("b")], None, ["b", "a"]),
    ("requests on their way take slots (split pool)", [room("a", busy=1, waiting=1), room("b")], None,
     ["b", "a"]),
    ("queued requests take slots too", [room("a", waiting=2), room("b", busy=1)], None, ["b", "a"]),
    ("full: the shorter wait", [full("a", waiting=5), full("b", waiting=2)], None, ["b", "a"]),
    ("full: more slots drain a queue sooner", [full("a", waiting=3, slots=4, busy=4), full("b", waiting=3)], None,
     ["a", "b"]),
    ("full: a faster pool sooner", [full("a", waiting=2), full("b", waiting=2, service_s=1.0)], None, ["b", "a"]),
    ("unified: a slot but too few tokens waits for one to end",
     [V("a", slots=4, busy=1, free_tokens=100, unified=True, need_tokens=500), full("b", waiting=1)], None,
     ["a", "b"]),
    ("unified: enough tokens is room",
     [full("a"), V("b", slots=1, free_tokens=600, unified=True, need_tokens=500)], None, ["b", "a"]),
    ("pool not probed: counted on its guessed slots", [full("a", waiting=2), V("b"), room("c")], None,
     ["c", "b", "a"]),
    ("pool not probed, requests on their way: a queue", [V("b", waiting=2), room("c", busy=1)], None, ["c", "b"]),
    ("a load beats a long queue", [full("a", waiting=3, service_s=2.0), cold("b")], None, ["b", "a"]),
    ("a short queue beats a load", [full("a", service_s=2.0), cold("b")], None, ["a", "b"]),
    ("equal waits: the resident one", [full("a", service_s=3.0, slots=1, busy=1), cold("b")], None, ["a", "b"]),
    ("cold burst: the host already loading has a queue", [cold("a", waiting=1), cold("b")], None, ["b", "a"]),
    ("cold: more slots on the loading host take the next", [cold("a", waiting=1, slots_guess=2), cold("b")], None,
     ["a", "b"]),
    ("least eviction", [cold("a", load=LoadCost(evict_bytes=8 << 30, evict_models=1)),
                        cold("b", load=LoadCost(evict_bytes=2 << 30, evict_models=2)), cold("c", load=LoadCost())],
     None, ["c", "b", "a"]),
    ("a preview's eviction beats an unknown load cost",
     [V("a", resident=False, load=None), cold("b", load=LoadCost(evict_bytes=19 << 30, evict_models=1))],
     None, ["b", "a"]),
    ("no GPU reading, an idle host: its load counts", [full("a", waiting=4), cold("b", load=LoadCost(
        load_s=2.0, checked=False))], None, ["b", "a"]),
    ("no GPU reading, other models busy there: after every known wait",
     [cold("a", load=LoadCost(checked=False, waits_for_busy=True)), full("b", waiting=20)], None, ["b", "a"]),
    ("cannot load last of the healthy", [cold("a", load=LoadCost(possible=False)), V("b", resident=False)], None,
     ["b", "a"]),
    ("out last, even with room", [room("a", out=True), cold("b", load=LoadCost(possible=False))], None, ["b", "a"]),
    ("sticky with room beats more free KV", [room("a", free_tokens=9000, slots=4), room("b")], "b", ["b", "a"]),
    ("sticky a little slower stays", [room("a"), full("b", service_s=0.5)], "b", ["b", "a"]),
    ("sticky much slower moves", [room("a"), full("b", waiting=1)], "b", ["a", "b"]),
    ("sticky but out moves", [room("a"), room("b", out=True)], "b", ["a", "b"]),
    ("sticky among full, within the slack, stays", [full("a", service_s=1.0), full("b", waiting=1, service_s=1.0)],
     "b", ["b", "a"]),
    ("sticky far behind among full moves", [full("a"), full("b", waiting=3)], "b", ["a", "b"]),
    ("sticky whose model is gone: a load vs room moves", [room("a"), cold("b")], "b", ["a", "b"]),
    ("sticky unknown to the plan", [room("a"), room("b")], "gone", ["a", "b"]),
]


@pytest.mark.parametrize(("name", "views", "sticky", "expected"), CASES, ids=[case[0] for case in CASES])
def test_rank(name: str, views: list[CandidateView], sticky: str | None, expected: list[str]) -> None:
    ranked = rank(views, sticky=sticky)
    assert [entry.name for entry in ranked] == expected
    if sticky is not None and ranked[0].name == sticky:
        assert ranked[0].reason.startswith("sticky")


def test_print_matrix() -> None:
    print()
    print(f"{'case':<52} {'sticky':<7} {'order':<10} {'waits':<16} first's reason")
    for name, views, sticky, expected in CASES:
        ranked = rank(views, sticky=sticky)
        waits = " ".join("?" if e.expected_s is None else f"{e.expected_s:g}" for e in ranked)
        print(f"{name:<52} {sticky or '-':<7} {' > '.join(e.name for e in ranked):<10} {waits:<16} "
              f"{ranked[0].reason}")
        assert [entry.name for entry in ranked] == expected


def test_the_route_header_states_the_numbers_it_compared() -> None:
    ranked = rank([room("host-a", busy=1, free_tokens=3072), full("host-b", waiting=5, service_s=1.4),
                   cold("host-c", load=LoadCost(load_s=2.1))])
    assert [entry.name for entry in ranked] == ["host-a", "host-c", "host-b"]
    assert ranked[0].reason == ("resident, first token in 0.0 s (1 of 2 slots free, 3,072 tokens free); "
                                "host-c: load 2.1 s; host-b: 4.2 s (6 ahead x 1.4 s / 2 slots)")
    assert ranked[1].reason.startswith("loads without eviction, first token in 2.1 s (load 2.1 s); host-a: 0.0 s")
    assert rank([full("a", waiting=2)])[0].standing is Standing.FULL
    assert "out after failing" in rank([room("a", out=True)])[0].reason
    unchecked = rank([cold("a", load=LoadCost(load_s=2.0, checked=False), waiting=1)])[0]
    assert unchecked.reason == "loads, first token in 7.0 s (load 2.0 s + 1 ahead x 5.0 s / 1 slot, no GPU reading)"
    names = [f"h{i}" for i in range(8)]
    many = rank([room(name) for name in names])[0].reason
    assert many.count(";") == 3 and len(many) < 200  # the best three others, header-sized


def test_outages_double_while_failing_and_clear_on_a_later_success() -> None:
    clock = FakeClock()
    outages = Outages(clock)
    assert outages.failed("a", "refused", down_s=10, max_down_s=25) == 10
    assert outages.is_out("a")
    clock.advance(10.5)
    assert not outages.is_out("a")
    assert outages.failed("a", "refused", down_s=10, max_down_s=25) == 20
    assert outages.failed("a", "refused", down_s=10, max_down_s=25) == 25  # capped
    outages.succeeded("a", since_s=clock() - 1)  # began before the failure: proves nothing
    assert outages.is_out("a")
    clock.advance(1)
    outages.succeeded("a", since_s=clock())
    assert not outages.is_out("a") and outages.out_until("a") is None
    assert outages.outages_total == {"a": 3}


def _chat(*messages: tuple[str, str], model: str = "m") -> ParsedRequest:
    body = {"model": model, "messages": [{"role": role, "content": text} for role, text in messages]}
    return parse(Dialect.OPENAI, Operation.CHAT, body, "/v1/chat/completions")


def test_a_conversation_keeps_its_key_as_it_grows() -> None:
    first = conversation_key(_chat(("system", "be brief"), ("user", "hello")))
    later = conversation_key(_chat(("system", "be brief"), ("user", "hello"), ("assistant", "hi"),
                                   ("user", "more")))
    other = conversation_key(_chat(("system", "be brief"), ("user", "bye")))
    other_model = conversation_key(_chat(("system", "be brief"), ("user", "hello"), model="n"))
    assert first is not None and first == later
    assert len({first, other, other_model}) == 3


def test_sticky_map_is_bounded_and_forgets_idle_conversations() -> None:
    clock = FakeClock()
    sticky = StickyMap(max_entries=2, ttl_s=60, clock=clock)
    sticky.remember("c1", "a")
    sticky.remember("c2", "b")
    sticky.remember("c3", "a")
    assert len(sticky) == 2 and sticky.get("c1") is None and sticky.get("c3") == "a"
    clock.advance(61)
    assert sticky.get("c2") is None


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "messages": [{"role": "user", "content": "a\\udc98b"}]}',  # a lone low surrogate
    b'{"model": "m", "messages": [{"role": "system", "content": "\\ud800"}, {"role": "user", "content": "x"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
    b'{"model": "\\udc00", "messages": [{"role": "user", "content": "x"}]}',
])
def test_a_conversation_key_exists_for_any_json_text(raw: bytes) -> None:
    """JSON allows escapes of lone surrogates, which are not UTF-8: the key is still made (a 500 before)."""
    from gateway import dialects
    parsed = parse(Dialect.OPENAI, Operation.CHAT, dialects.decode_body(raw), "/v1/chat/completions")
    key = conversation_key(parsed)
    assert key is not None and len(key) == 32
    assert key == conversation_key(parsed)
