"""Ollama's runtime: its listing (every spelling of a name), its tags as they are."""

from __future__ import annotations

from gateway.domain import BackendKind
from gateway.runtimes import runtime_for

LISTING = {"models": [{"name": "qwen3:latest", "model": "qwen3:latest"}, {"name": "llama3:8b", "model": "llama3:8b"}]}


def test_a_listed_name_is_matched_with_and_without_its_latest_tag() -> None:
    names = runtime_for(BackendKind.OLLAMA).model_names(LISTING)
    assert {"qwen3", "qwen3:latest", "llama3:8b"} <= names


def test_its_tags_are_its_own_models_entries() -> None:
    assert runtime_for(BackendKind.OLLAMA).ollama_tags(LISTING) == LISTING["models"]
