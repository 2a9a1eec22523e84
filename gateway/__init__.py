"""kvgate: a KV-cache-aware gateway for shared local LLM servers."""

__version__ = "0.1.0"
