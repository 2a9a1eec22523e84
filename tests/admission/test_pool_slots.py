"""Where a pool's slot count comes from (gateway/admission/pool_slots.py): configured wins and a disagreeing size
is reported; otherwise inferred, or assumed with why and how to set it; logged once per change. Printed (pytest -s)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, cast

import pytest

from gateway.admission.pool_slots import SlotBook
from gateway.backends import Backend
from gateway.backends.client import BackendClient
from gateway.config.settings import load_settings
from gateway.memory.ollama_slots import SlotInference
from gateway.memory.presets import preset_profile
from gateway.runtimes import runtime_for

MODEL = "llama3.1:8b"
TWO = SlotInference(2, True, "inferred from /api/ps size 6.82 GiB at a context of 8,192 tokens", (2,))
ALONE = SlotInference(1, True, "Ollama runs embedding models with one sequence", reflects_server=False)


def backend(**fields: Any) -> Backend:
    settings = load_settings(None, backends=[{"name": "o", "kind": "ollama", "url": "http://127.0.0.1:9", **fields}])
    config = settings.backends[0]
    return Backend(config, cast(BackendClient, None), runtime=runtime_for(config.kind))


CASES: list[tuple[str, dict[str, Any], SlotInference | None, int, str, bool]] = [
    ("unset, inferred", {}, TWO, 2, "inferred", False),
    ("unset, nothing to read", {}, None, 1, "assumed", False),
    ("configured, agrees", {"parallel": 2}, TWO, 2, "configured", False),
    ("configured, the size disagrees", {"parallel": 1}, TWO, 1, "configured", True),
    ("configured, an embedding model runs alone", {"parallel": 4}, ALONE, 4, "configured", False),
]


@pytest.mark.parametrize(("name", "fields", "inferred", "slots", "source", "disagrees"), CASES,
                         ids=[case[0] for case in CASES])
def test_settle(name: str, fields: dict[str, Any], inferred: SlotInference | None, slots: int, source: str,
                disagrees: bool) -> None:
    book = SlotBook()
    settled = book.settle(backend(**fields), MODEL, inferred, "the model has no /api/ps entry")
    print(f"\n{name:<44} -> {settled.slots} {settled.source}: {settled.detail}; "
          f"{book.disagreements.get(('o', MODEL), 'no disagreement')}")
    assert (settled.slots, settled.source) == (slots, source)
    assert (("o", MODEL) in book.disagreements) is disagrees
    assert book.sources[("o", MODEL)] == settled


def test_a_disagreement_is_cleared_when_the_size_agrees_again_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.admission.kv_pools")
    book, configured = SlotBook(), backend(parallel=1)
    for _ in range(3):
        book.settle(configured, MODEL, TWO)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "has parallel = 1 but model 'llama3.1:8b' runs 2" in warnings[0].getMessage()
    book.settle(configured, MODEL, SlotInference(1, True, "inferred ...", (1,)))
    assert not book.disagreements


def test_logged_once_per_change_with_how_to_set_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.admission.kv_pools")
    book, unset = SlotBook(), backend()
    book.settle(unset, MODEL, TWO)
    book.settle(unset, MODEL, TWO)
    book.settle(unset, MODEL, None, "its profile can't be derived (no model_info)")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("model 'llama3.1:8b' on backend 'o' at http://127.0.0.1:9: 2 slots, inferred from")
    assert "set parallel = N in [[backends]] (KVGATE_BACKEND__PARALLEL for the first backend)" in lines[0]
    assert "1 slot, assumed 1: its profile can't be derived" in lines[1]
    assert caplog.records[1].levelname == "WARNING"


def test_the_backends_parallel_is_the_guess_for_a_model_not_loaded_yet() -> None:
    book, unset = SlotBook(), backend()
    profile = preset_profile(MODEL)
    assert book.parallel_guess(unset, profile) == 1 and book.learned_parallel("o") is None
    book.settle(unset, "nomic-embed-text", ALONE)  # an embedding model says nothing of OLLAMA_NUM_PARALLEL
    assert book.learned_parallel("o") is None
    book.settle(unset, MODEL, TWO)
    assert book.parallel_guess(unset, profile) == 2 and book.learned_parallel("o") == 2
    assert book.parallel_guess(unset, replace(profile, capabilities=("embedding",))) == 1
    assert book.parallel_guess(unset, replace(profile, shape=replace(profile.shape, architecture="qwen3next"))) == 1
    assert book.parallel_guess(backend(parallel=3), profile) == 3


def test_a_llama_server_reports_its_slots() -> None:
    book = SlotBook()
    server = backend(kind="llama-server")
    assert book.reported(server, 4) == 4 and book.sources[("o", "")].source == "reported"
    assert book.reported(backend(kind="llama-server", parallel=2), None) == 2
    assert book.sources[("o", "")].source == "configured"
    assert book.reported(server, None) == 1 and book.sources[("o", "")].source == "assumed"
