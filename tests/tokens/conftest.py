"""Shared state for the token tests: a per-vocabulary tally printed as N/N after the run."""

from __future__ import annotations

import pytest

from tests.tokens.vocab_vectors import VECTOR_RESULTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not VECTOR_RESULTS:
        return
    terminalreporter.section("llama.cpp tokenizer vectors (matched/total)")
    for vocab, results in VECTOR_RESULTS.items():
        terminalreporter.write_line(f"{vocab:16s} {sum(results)}/{len(results)}")
