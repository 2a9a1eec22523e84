"""Model lists as each kind of backend reports them, turned into the two shapes clients ask for.

Ollama lists models at ``GET /api/tags`` (``{"models": [{"name", "model", ...}]}``); llama-server and OpenAI-style
servers at ``GET /v1/models`` (``{"object": "list", "data": [{"id", ...}]}``; llama-server adds an Ollama-like
``models`` array). Pure functions: no I/O. Which of them a backend uses is its runtime's (gateway/runtimes/).
"""

from __future__ import annotations

from typing import Any

from gateway.backends.model_names import name_candidates


def listed_names(listing: dict[str, Any]) -> frozenset[str]:
    """Every name a listing gives its models: Ollama's ``models`` (``name``, ``model``) and the ``/v1/models``
    ``data`` (``id``, ``aliases``), whichever it has."""
    names: set[str] = set()
    for entry in listing.get("models") or []:
        if isinstance(entry, dict):
            names.update(str(entry[key]) for key in ("name", "model") if isinstance(entry.get(key), str))
    for entry in listing.get("data") or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            names.add(entry["id"])
            names.update(alias for alias in entry.get("aliases") or [] if isinstance(alias, str))
    return frozenset(names)


def with_spellings(names: frozenset[str]) -> frozenset[str]:
    """``names`` and every other spelling of each (Ollama's ``x`` is ``x:latest``)."""
    return frozenset(spelling for name in names for spelling in name_candidates(name))


def tags_of_models(listing: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``models`` entries of a listing, as they are (Ollama's own ``/api/tags``)."""
    return [entry for entry in listing.get("models") or [] if isinstance(entry, dict)]


def as_ollama_tags(listing: dict[str, Any]) -> list[dict[str, Any]]:
    """Entries for ``/api/tags`` from a ``/v1/models`` listing (its ``models`` array where it has one)."""
    if isinstance(listing.get("models"), list):
        return tags_of_models(listing)
    return [
        {
            "name": entry["id"],
            "model": entry["id"],
            "modified_at": "1970-01-01T00:00:00Z",
            "size": 0,
            "digest": "",
            "details": {"format": "", "family": "", "families": None, "parameter_size": "", "quantization_level": ""},
        }
        for entry in listing.get("data") or []
        if isinstance(entry, dict) and isinstance(entry.get("id"), str)
    ]


def as_openai_models(listing: dict[str, Any]) -> list[dict[str, Any]]:
    """Entries for ``/v1/models`` from a backend's ``/v1/models`` listing."""
    return [entry for entry in listing.get("data") or [] if isinstance(entry, dict)]


def merge_unique(groups: list[list[dict[str, Any]]], key: str) -> list[dict[str, Any]]:
    """Concatenate listings; the first backend that lists a name keeps it."""
    seen: set[str] = set()
    merged: list[dict[str, Any]] = []
    for group in groups:
        for entry in group:
            name = str(entry.get(key, ""))
            if name in seen:
                continue
            seen.add(name)
            merged.append(entry)
    return merged
