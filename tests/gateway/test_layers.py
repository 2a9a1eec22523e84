"""Issue 24, point 6 (its import half): the pure layers load no I/O. Importing the domain, the dialects, the
planner, trimming and summarizing, or the memory math loads neither aiohttp nor asyncio nor redis; kvsim loads of the
gateway only the GGUF reader and the tokenizer conversion. Each import runs in a fresh interpreter. Before the package
facades became lazy (gateway/support/lazy.py): ``import gateway.dialects`` loaded 59 gateway modules and aiohttp,
the planner redis and asyncio, kvsim 51 gateway modules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("aiohttp", "asyncio", "redis")
PURE = ["gateway.domain", "gateway.dialects", "gateway.admission.planner", "gateway.fitting.trim",
        "gateway.fitting.summary_fit", "gateway.memory.kv", "gateway.memory.fit_estimate"]
KVSIM_MAY_LOAD = {"gateway", "gateway.support", "gateway.support.gguf_reader", "gateway.support.lazy", "gateway.tokens",
                  "gateway.tokens.gguf_vocab", "gateway.tokens.pretokenizers", "gateway.tokens.spm_merges",
                  "gateway.tokens.tokenizer_cache",
                  "gateway.tokens.vocab_attrs"}


def _loaded(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(json.loads(result.stdout))


@pytest.mark.parametrize("module", PURE)
def test_a_pure_layer_loads_no_io(module: str) -> None:
    loaded = _loaded(module)
    gateway_modules = [m for m in loaded if m.startswith("gateway")]
    print(f"\n  import {module}: {len(gateway_modules)} gateway modules; "
          f"{ {h: h in loaded for h in HEAVY} }")
    assert not [h for h in HEAVY if h in loaded]


def test_kvsim_takes_only_the_gguf_reader_and_the_tokenizer_conversion() -> None:
    gateway_modules = {m for m in _loaded("kvsim") if m.startswith("gateway")}
    print(f"\n  import kvsim: {sorted(gateway_modules)}")
    assert gateway_modules <= KVSIM_MAY_LOAD, sorted(gateway_modules - KVSIM_MAY_LOAD)
