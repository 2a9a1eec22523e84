"""Derive BPE merges from a SentencePiece (`tokenizer.ggml.model = "llama"`) vocabulary.

llama.cpp's SPM tokenizer starts from single characters and repeatedly joins the adjacent pair whose
concatenation is a vocabulary piece with the highest score (leftmost first on ties). A BPE model whose merges are
"every way to split a normal piece into two vocabulary pieces", ranked by the piece's score, makes the same
choices, so Hugging Face's BPE with byte fallback reproduces it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.tokens.vocab_attrs import Attr


def spm_merges(tokens: Sequence[str], scores: Sequence[float], attrs: Sequence[int]) -> list[tuple[str, str]]:
    """Merges ordered from the highest-scoring result piece to the lowest."""
    vocab = set(tokens)
    normal = int(Attr.NORMAL)
    ranked: list[tuple[float, int, int, str, str]] = []
    for token_id, piece in enumerate(tokens):
        if not attrs[token_id] & normal or len(piece) < 2:
            continue
        score = float(scores[token_id])
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, token_id, cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]
