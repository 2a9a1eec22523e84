"""Admission data is validated once, at construction, with messages that name the field and the value."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.admission import Admit, LedgerSnapshot, Policy, PoolKey, PoolSpec, RequestCost, Rewrites
from gateway.admission.rejections import AdmissionRejected, queue_full
from gateway.domain import BackendKind
from gateway.errors import GatewayError


def test_split_pool_is_slots_times_slot_context() -> None:
    pool = PoolSpec.split_pool("gpu0", "llama3.1:8b", BackendKind.OLLAMA, slot_ctx_tokens=8192, slots=4)
    assert (pool.pool_tokens, pool.unified, pool.key) == (32768, False, PoolKey("gpu0", "llama3.1:8b"))


def test_unified_pool_lets_a_slot_grow_to_the_whole_pool_unless_capped() -> None:
    assert PoolSpec.unified_pool("b", "m", pool_tokens=16384, slots=4).slot_ctx_tokens == 16384
    capped = PoolSpec.unified_pool("b", "m", pool_tokens=16384, slots=4, slot_ctx_tokens=4096)
    assert (capped.slot_ctx_tokens, capped.unified, capped.backend_kind) == (4096, True, "llama-server")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend_kind": "vllm"}, "backend_kind is 'vllm'"),
        ({"slot_ctx_tokens": 0}, "slot_ctx_tokens"),
        ({"slots": 0}, "slots"),
        ({"pool_tokens": 100}, "pool_tokens \\(100\\) is smaller than slot_ctx_tokens"),
    ],
)
def test_pool_spec_refuses_impossible_pools(fields: dict[str, Any], message: str) -> None:
    good: dict[str, Any] = {
        "backend": "b", "model": "m", "backend_kind": BackendKind.OLLAMA,
        "slot_ctx_tokens": 4096, "slots": 2, "unified": False, "pool_tokens": 8192,
    }  # fmt: skip
    with pytest.raises(ValueError, match=message):
        PoolSpec(**{**good, **fields})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, True, None, None), "prompt_tokens is -1"),
        ((10, True, -1, None), "max_output_tokens is -1"),
        ((10, True, None, 0), "requested_num_ctx is 0"),
    ],
)
def test_request_cost_refuses_negative_counts(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RequestCost(*args)


@pytest.mark.parametrize(
    "fields",
    [
        {"default_output_tokens": -1},
        {"max_queue": -1},
        {"estimate_margin": -0.1},
        {"queue_timeout_s": 0},
        {"overtake_window_s": -1},
        {"per_tenant_max_active": 0},
    ],
)
def test_policy_refuses_nonsense(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Policy(**fields)


def test_decisions_are_plain_comparable_data() -> None:
    assert Admit(10) == Admit(10, Rewrites(), ())
    assert not Rewrites() and Rewrites(num_ctx=8192) and Rewrites(max_output_tokens=0)


def test_snapshot_counts_are_read_only_whatever_was_passed_in() -> None:
    counts = {"a": 1}
    snapshot = LedgerSnapshot(1, 10, counts)
    counts["a"] = 7
    assert snapshot.per_tenant_active == {"a": 1}


def test_admission_rejected_fits_the_gateway_error_tree() -> None:
    error = AdmissionRejected(queue_full(PoolKey("gpu0", "m"), 256, 256))
    assert isinstance(error, GatewayError)
    assert (error.status, error.code, error.reject.code) == (503, "queue_full", "queue_full")
    assert "256 requests are already waiting for model 'm' on backend 'gpu0'" in error.message
