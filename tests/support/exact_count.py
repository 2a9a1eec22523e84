"""Settings that give a model behind a fake backend an exact count: its GGUF vocabulary, converted once per run.

A fake backend has no tokenizer kvgate can ask (``/api/show`` answers nothing useful), so its prompts are estimated,
and an estimate never refuses (issue 22): tests of what kvgate refuses on a real count (tenant caps, the context)
name the model's vocabulary, as an operator would with ``[models."NAME"] gguf_path``, and let the first count wait
for the tokenizer (``count_budget_s``) instead of estimating meanwhile.
"""

from __future__ import annotations

from typing import Any

from tests.tokens.vocab_vectors import vocab_path, warmed_cache_dir

LLAMA3_VOCAB = "llama-bpe"


def exact_counting(*models: str, vocab: str = LLAMA3_VOCAB) -> dict[str, Any]:
    """``running_gateway`` overrides counting ``models`` exactly with ``vocab`` (Llama 3's by default)."""
    return {
        "models": {model: {"gguf_path": str(vocab_path(vocab))} for model in models},
        "counting": {"cache_dir": str(warmed_cache_dir(vocab)), "count_budget_s": 30.0},
    }
