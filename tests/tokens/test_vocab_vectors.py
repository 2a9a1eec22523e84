"""Every llama.cpp test string of every shipped vocabulary tokenizes to llama.cpp's expected ids.

A summary line per vocabulary (N/N) is printed at the end of the run by conftest.py.
"""

from __future__ import annotations

import pytest

from tests.tokens.vocab_vectors import VECTOR_RESULTS, VocabCase, read_cases, vector_tokenizer

VOCABS = ("llama-bpe", "qwen2", "gpt-2", "deepseek-coder", "llama-spm", "phi-3", "gemma-4")

CASES = [case for vocab in VOCABS for case in read_cases(vocab)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.vocab}-{c.index:02d}")
def test_vector(case: VocabCase) -> None:
    got = tuple(vector_tokenizer(case.vocab).encode(case.text, add_special_tokens=False).ids)
    VECTOR_RESULTS.setdefault(case.vocab, []).append(got == case.expected_ids)
    assert got == case.expected_ids, f"{case.text!r}"


@pytest.mark.parametrize("vocab", VOCABS)
def test_every_vector_of_vocab(vocab: str) -> None:
    cases = read_cases(vocab)
    tokenizer = vector_tokenizer(vocab)
    matched = sum(
        tuple(enc.ids) == case.expected_ids
        for case, enc in zip(
            cases, tokenizer.encode_batch([c.text for c in cases], add_special_tokens=False), strict=True
        )
    )
    assert matched == len(cases), f"{vocab}: {matched}/{len(cases)}"
