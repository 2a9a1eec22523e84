"""Model names: which spellings name the same model (Ollama's ``x`` is ``x:latest``), and finding one in a list.

Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection


def canonical_model(name: str) -> str:
    """Ollama's spelling of a model name: a name without a tag means its ``:latest`` (``x`` is ``x:latest``; in
    ``host:5000/x`` the colon is the port's, so that is ``host:5000/x:latest``)."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def name_candidates(model: str) -> tuple[str, ...]:
    """The spellings that name the same model as ``model``, ``model`` itself first."""
    canonical = canonical_model(model)
    bare = canonical.removesuffix(":latest")
    return tuple(dict.fromkeys((model, canonical, bare)))


def find_model(model: str, names: Collection[str]) -> str | None:
    """The name in ``names`` that means ``model`` (itself if listed, else its ``:latest`` twin), None if none does."""
    if model in names:
        return model
    return next((name for name in name_candidates(model)[1:] if name in names), None)


def same_model(a: str, b: str) -> bool:
    """Whether two names mean the same model (``x`` and ``x:latest`` do)."""
    return canonical_model(a) == canonical_model(b)
