"""What a backend's log says about its memory settings (pure): the slot layout and cache types llama.cpp prints at
load (``gateway.memory.llama_log``), flash attention, Ollama's ``server config env="map[...]"`` line (every
OLLAMA_* setting it runs with), and the longest prompt the log mentions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gateway.memory.llama_log import parse_kv_caches, parse_slots

_FLASH = re.compile(r"flash_attn\s*=\s*(\w+)|Flash Attention was \w+, set to (\w+)|--flash-attn[ =](\w+)",
                    re.IGNORECASE)
_OLLAMA_ENV = re.compile(r"server config\"? env=\"?map\[(?P<pairs>[^\]]*)\]")
_PAIR = re.compile(r"(OLLAMA_[A-Z_]+):(\S*)")
_PROMPT = re.compile(r"task\.n_tokens = (\d+)|n_prompt_tokens\"?\s*[:=]\s*(\d+)|request \((\d+) tokens\) exceeds|"
                     r"prompt_eval_count\"?\s*[:=]\s*(\d+)")
_ON = {"1", "true", "on", "enabled", "yes"}
_OFF = {"0", "false", "off", "disabled", "no"}


@dataclass(frozen=True)
class LogSettings:
    """None where the log does not say."""

    n_slots: int | None = None
    n_ctx_slot: int | None = None
    kv_unified: bool | None = None
    type_k: str | None = None
    type_v: str | None = None
    flash_attn: bool | None = None
    ollama_env: dict[str, str] = field(default_factory=dict)
    longest_prompt_tokens: int | None = None


def _flash(text: str, env: dict[str, str]) -> bool | None:
    value = None
    for match in _FLASH.finditer(text):
        word = next(group for group in match.groups() if group is not None).lower()
        if word in _ON or word in _OFF:
            value = word in _ON
    if value is None and env.get("OLLAMA_FLASH_ATTENTION", "") != "":
        value = env["OLLAMA_FLASH_ATTENTION"].lower() in _ON
    return value


def parse_backend_log(text: str) -> LogSettings:
    slots = parse_slots(text)
    caches = parse_kv_caches(text)
    env: dict[str, str] = {}
    for match in _OLLAMA_ENV.finditer(text):
        env = dict(_PAIR.findall(match["pairs"]))  # the last start-up wins
    type_k = caches[-1].type_k if caches else (env.get("OLLAMA_KV_CACHE_TYPE") or None)
    type_v = caches[-1].type_v if caches else (env.get("OLLAMA_KV_CACHE_TYPE") or None)
    prompts = [int(next(g for g in m.groups() if g is not None)) for m in _PROMPT.finditer(text)]
    return LogSettings(
        n_slots=slots.n_slots if slots else None,
        n_ctx_slot=slots.n_ctx_slot if slots else None,
        kv_unified=slots.kv_unified if slots else None,
        type_k=type_k, type_v=type_v, flash_attn=_flash(text, env), ollama_env=env,
        longest_prompt_tokens=max(prompts) if prompts else None,
    )


def env_int(env: dict[str, str], name: str) -> int | None:
    """An OLLAMA_* integer from the env map; None when unset, empty, 0 (Ollama's "automatic") or not a number."""
    value = env.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else None
