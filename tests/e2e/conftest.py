"""The adversarial matrices (test_no_escape_matrix.py) are printed at the end of every run, passed or not."""

from __future__ import annotations

import pytest

from tests.support.no_escape import MATRICES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not MATRICES:
        return
    terminalreporter.section("no request escapes the ledger: failures direct / through kvgate")
    for matrix in MATRICES:
        for line in matrix.splitlines():
            terminalreporter.write_line(line)
