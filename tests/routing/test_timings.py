"""What routing learns (pure): service times per pool (routing/service_times.py) and load times per backend and
model (backends/load_times.py), with their fallbacks, table-driven and printed (pytest -s)."""

from __future__ import annotations

import pytest

from gateway.backends.load_times import WINDOW as LOAD_WINDOW
from gateway.backends.load_times import LoadTimes, reported_load_s
from gateway.routing.service_times import WINDOW as SERVICE_WINDOW
from gateway.routing.service_times import ServiceTimes


def test_service_time_is_a_moving_median_per_pool_borrowed_by_the_same_model_elsewhere() -> None:
    times = ServiceTimes()
    assert times.expected_s("a", "m") is None
    for seconds in (1.0, 1.2, 30.0):  # one slow answer does not move the median
        times.record("a", "m", seconds)
    assert times.expected_s("a", "m") == 1.2
    assert times.expected_s("b", "m") == 1.2  # a pool with none yet: the same model's elsewhere
    assert times.expected_s("b", "other") is None
    for _ in range(SERVICE_WINDOW):  # the load changed: within a window the median follows
        times.record("a", "m", 4.0)
    assert times.expected_s("a", "m") == 4.0 and times.count("a", "m") == SERVICE_WINDOW
    times.record("a", "m", -1.0)  # a clock that went back is not a service time
    assert times.count("a", "m") == SERVICE_WINDOW and times.expected_s("a", "m") == 4.0


def test_load_time_here_then_the_model_elsewhere_then_other_models_here() -> None:
    times = LoadTimes()
    assert times.expected_s("a", "llama3.1:8b") is None
    times.record("b", "llama3.1:8b", 2.0)
    times.record("b", "llama3.1:8b", 4.0)
    assert times.expected_s("a", "llama3.1:8b") == (3.0, "on b")
    times.record("a", "qwen2.5:7b", 7.0)
    assert times.expected_s("a", "llama3.1:8b") == (3.0, "on b")  # the same model elsewhere before other models
    assert times.expected_s("a", "gemma3:12b") == (7.0, "of other models here")
    times.record("a", "llama3.1", 1.0)  # Ollama's spelling: no tag is :latest, another model here
    assert times.expected_s("a", "llama3.1:latest") == (1.0, "here")
    for _ in range(LOAD_WINDOW):
        times.record("b", "llama3.1:8b", 9.0)
    assert times.expected_s("b", "llama3.1:8b") == (9.0, "here")


@pytest.mark.parametrize(("answer", "seconds"), [
    ({"done": True, "done_reason": "load", "load_duration": 2_100_000_000}, 2.1),
    ({"done": True, "done_reason": "load"}, None),  # Ollama may send no metrics with a load: timed instead
    ({"load_duration": "2s"}, None), ({"load_duration": True}, None), ({"load_duration": -5}, None),
    ([], None), (None, None), ({"load_duration": 0}, 0.0),
])
def test_the_reported_load_duration(answer: object, seconds: float | None) -> None:
    print(f"\n{answer!r:<70} -> {seconds}")
    assert reported_load_s(answer) == seconds
