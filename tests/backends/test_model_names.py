"""Model names: ``x`` is ``x:latest``; the colon of a registry's port is no tag."""

from __future__ import annotations

import pytest

from gateway.backends.model_names import canonical_model, find_model, same_model


@pytest.mark.parametrize(("a", "b", "same"), [
    ("llama3", "llama3:latest", True),
    ("llama3:latest", "llama3", True),
    ("llama3", "llama3", True),
    ("llama3:8b", "llama3", False),
    ("llama3:8b", "llama3:latest", False),
    ("library/qwen2", "library/qwen2:latest", True),
    ("host:5000/ns/m", "host:5000/ns/m:latest", True),  # the colon is the port's: no tag
    ("host:5000/ns/m", "host:5000/ns/m:7b", False),
    ("Llama3", "llama3", False),
])
def test_latest_is_the_default_tag(a: str, b: str, same: bool) -> None:
    assert same_model(a, b) is same and same_model(b, a) is same


@pytest.mark.parametrize(("model", "names", "found"), [
    ("qwen2", {"qwen2:latest"}, "qwen2:latest"),
    ("qwen2", {"qwen2", "qwen2:latest"}, "qwen2"),  # the name itself first
    ("qwen2:latest", {"qwen2"}, "qwen2"),
    ("qwen2:7b", {"qwen2:latest", "qwen2"}, None),
    ("mistral", {"qwen2:latest"}, None),
])
def test_find_model(model: str, names: set[str], found: str | None) -> None:
    assert find_model(model, names) == found
    assert canonical_model(model).endswith(":latest") or ":" in model
