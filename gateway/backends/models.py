"""Model lists as each kind of backend reports them, turned into the two shapes clients ask for.

Ollama lists models at ``GET /api/tags`` (``{"models": [{"name", "model", ...}]}``); llama-server and OpenAI-style
servers at ``GET /v1/models`` (``{"object": "list", "data": [{"id", ...}]}``; llama-server adds an Ollama-like
``models`` array). Pure functions: no I/O.
"""

from __future__ import annotations

from typing import Any

from gateway.backends.client import name_candidates
from gateway.domain import BackendKind


def list_path(kind: BackendKind) -> str:
    return "/api/tags" if kind is BackendKind.OLLAMA else "/v1/models"


def model_names(kind: BackendKind, listing: dict[str, Any]) -> frozenset[str]:
    """Every name a client may use for the models in a listing (Ollama's ``x`` is ``x:latest``)."""
    names: set[str] = set()
    for entry in listing.get("models") or []:
        if isinstance(entry, dict):
            names.update(str(entry[key]) for key in ("name", "model") if isinstance(entry.get(key), str))
    for entry in listing.get("data") or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            names.add(entry["id"])
            names.update(alias for alias in entry.get("aliases") or [] if isinstance(alias, str))
    if kind is BackendKind.OLLAMA:
        names.update(spelling for name in list(names) for spelling in name_candidates(name))
    return frozenset(names)


def as_ollama_tags(kind: BackendKind, listing: dict[str, Any]) -> list[dict[str, Any]]:
    """Entries for ``/api/tags`` from any backend's listing."""
    if kind is BackendKind.OLLAMA or isinstance(listing.get("models"), list):
        return [entry for entry in listing.get("models") or [] if isinstance(entry, dict)]
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
