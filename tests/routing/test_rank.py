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
    return CandidateView(name, free_tokens=4096, free_slots=2, **more)


def full(name: str, **more: Any) -> CandidateView:
    return CandidateView(name, free_tokens=0, free_slots=0, **more)


CASES: list[tuple[str, list[CandidateView], str | None, list[str]]] = [
    ("most free KV first", [room("a"), V("b", free_tokens=8192, free_slots=2)], None, ["b", "a"]),
    ("ties keep config order", [room("a"), room("b")], None, ["a", "b"]),
    ("room beats full", [full("a", queue_length=0), room("b")], None, ["b", "a"]),
    ("a queue means no room now", [V("a", free_tokens=9000, free_slots=3, queue_length=1), room("b")], None,
     ["b", "a"]),
    ("full: shortest queue", [full("a", queue_length=5), full("b", queue_length=2)], None, ["b", "a"]),
    ("unified: a slot but too few tokens is full",
     [V("a", free_tokens=100, free_slots=3, unified=True, need_tokens=500), full("b", queue_length=1)], None,
     ["a", "b"]),
    ("unified: enough tokens is room",
     [full("a"), V("b", free_tokens=600, free_slots=1, unified=True, need_tokens=500)], None, ["b", "a"]),
    ("unknown pool between room and full", [full("a"), V("b"), room("c")], None, ["c", "b", "a"]),
    ("resident before a load", [V("a", resident=False, load=LoadCost()), full("b")], None, ["b", "a"]),
    ("least eviction", [V("a", resident=False, load=LoadCost(evict_bytes=8 << 30, evict_models=1)),
                        V("b", resident=False, load=LoadCost(evict_bytes=2 << 30, evict_models=2)),
                        V("c", resident=False, load=LoadCost())], None, ["c", "b", "a"]),
    ("a preview's eviction beats an unknown load cost",
     [V("a", resident=False, load=None), V("b", resident=False, load=LoadCost(evict_bytes=19 << 30, evict_models=1))],
     None, ["b", "a"]),
    ("cannot load last of the healthy", [V("a", resident=False, load=LoadCost(possible=False)),
                                         V("b", resident=False, load=None)], None, ["b", "a"]),
    ("out last, even with room", [room("a", out=True), V("b", resident=False, load=LoadCost(possible=False))],
     None, ["b", "a"]),
    ("sticky with room beats more free KV", [V("a", free_tokens=9000, free_slots=4), room("b")], "b",
     ["b", "a"]),
    ("sticky but full moves", [room("a"), full("b", queue_length=1)], "b", ["a", "b"]),
    ("sticky but out moves", [room("a"), room("b", out=True)], "b", ["a", "b"]),
    ("sticky full among full stays", [full("a", queue_length=0), full("b", queue_length=3)], "b",
     ["b", "a"]),
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
    print(f"{'case':<42} {'sticky':<7} {'order':<10} first's reason")
    for name, views, sticky, expected in CASES:
        ranked = rank(views, sticky=sticky)
        print(f"{name:<42} {sticky or '-':<7} {' > '.join(e.name for e in ranked):<10} {ranked[0].reason}")
        assert [entry.name for entry in ranked] == expected


def test_reasons_name_the_numbers() -> None:
    assert rank([V("a", free_tokens=3072, free_slots=1)])[0].reason == "resident, 3,072 tokens free"
    assert rank([full("a", queue_length=2)])[0].standing is Standing.FULL
    assert "out after failing" in rank([room("a", out=True)])[0].reason


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
