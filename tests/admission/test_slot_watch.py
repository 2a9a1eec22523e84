"""Reading llama-server's /slots for elastic replies that are not streamed: the answer's shapes, and which reply
each busy slot feeds."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.admission import Ledger, Policy, PoolSpec, RequestCost, WaitingRoom
from gateway.admission.elastic import ElasticPools, Growth
from gateway.admission.slot_watch import feed
from gateway.domain import BackendKind
from gateway.runtimes import SlotUse, runtime_for

LLAMA = runtime_for(BackendKind.LLAMA_SERVER)
POOL = PoolSpec.unified_pool("cpp", "m", pool_tokens=4096, slots=4)


@pytest.mark.parametrize(("answer", "expected"), [
    ([{"is_processing": True, "n_prompt_tokens": 742, "next_token": [{"n_decoded": 230}]}], [SlotUse(512, 230)]),
    ([{"is_processing": True, "n_prompt_tokens": 742, "next_token": {"n_decoded": 230}}], [SlotUse(512, 230)]),
    ([{"is_processing": False, "n_prompt_tokens": 742, "next_token": [{"n_decoded": 230}]}], []),
    ([{"id": 0, "is_processing": False}], []),  # a slot that never had a task
    ([{"is_processing": True, "n_prompt_tokens": 10, "next_token": [{"n_decoded": 11}]}], []),  # impossible
    ([{"is_processing": True, "n_prompt_tokens": "742", "next_token": []}], []),
    ({"error": "not a list"}, []),
    (None, []),
    (["junk", 3, {"is_processing": True}], []),
])
def test_the_slots_answer_in_every_shape(answer: Any, expected: list[SlotUse]) -> None:
    assert LLAMA.slots_in_use(answer) == expected
    assert runtime_for(BackendKind.OLLAMA).slot_use_path is None


async def _growth(room: WaitingRoom, elastic: ElasticPools, prompt: int) -> Growth:
    cost = RequestCost(prompt, True, 2000, None, expected_output_tokens=200)
    permit = await room.acquire(POOL.key, POOL, cost, Policy(elastic_watermark=0.9))
    growth = elastic.start(permit, POOL, prompt, streamed=False)
    assert growth is not None
    return growth


async def test_each_reply_is_fed_the_longest_slot_with_its_prompt_and_grows() -> None:
    room = WaitingRoom(Ledger())
    elastic = ElasticPools(room.grow, step_tokens=64)
    a, b, c = [await _growth(room, elastic, p) for p in (500, 500, 900)]
    slots = [SlotUse(500, 150), SlotUse(501, 260), SlotUse(1300, 999)]
    feed((a, b, c), slots, now_s=1.0, poll_s=0.1)
    assert (a.output_tokens, b.output_tokens, c.output_tokens) == (260, 260, 0)  # same prompt: the longest
    assert a.held_tokens >= a.used_tokens and b.held_tokens >= b.used_tokens
    assert c.held_tokens == c.first_tokens  # its slot is not there (queued at the server): no change
    feed((a,), [SlotUse(500, 100)], now_s=2.0, poll_s=0.1)
    assert a.output_tokens == 260  # never less than it showed
    room.ledger.check_invariants()
    elastic.check_invariants({POOL.key: POOL})
