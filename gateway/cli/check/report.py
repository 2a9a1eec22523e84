"""Findings for people (text) and for scripts (JSON), and the exit code.

Exit codes: 0 nothing worse than OK/INFO, 1 a warning, 2 a critical finding, 3 the check could not run (an invalid
setting or argument)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway import __version__
from gateway.cli.check.fixes import Finding, Severity

EXIT_OK = 0
EXIT_WARNING = 1
EXIT_CRITICAL = 2
EXIT_CANNOT_CHECK = 3
_MARK = {Severity.OK: "ok  ", Severity.INFO: "info", Severity.WARNING: "WARN", Severity.CRITICAL: "CRIT"}


def exit_code(findings: Sequence[Finding]) -> int:
    worst = max((f.severity for f in findings), default=Severity.OK)
    return EXIT_CRITICAL if worst is Severity.CRITICAL else EXIT_WARNING if worst is Severity.WARNING else EXIT_OK


def render_text(findings: Sequence[Finding]) -> str:
    lines = [f"kvgate check {__version__}"]
    for finding in findings:
        where = f"[{finding.backend}] " if finding.backend else ""
        lines.append(f"{_MARK[finding.severity]}  {where}{finding.what}")
        lines += [f"        {line}" for line in finding.evidence]
        if finding.fix is not None:
            lines.append(f"        fix: {finding.fix}")
        lines += [f"         or: {alt}" for alt in finding.alternatives]
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    lines.append(f"{counts[Severity.CRITICAL]} critical, {counts[Severity.WARNING]} warning(s), "
                 f"{counts[Severity.INFO]} note(s); exit {exit_code(findings)}")
    return "\n".join(lines)


def render_json(findings: Sequence[Finding]) -> dict[str, Any]:
    return {"version": __version__, "exit_code": exit_code(findings), "findings": [f.to_json() for f in findings]}
