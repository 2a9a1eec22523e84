"""The GPU host's memory, read where readable: /proc/meminfo (RAM and swap) and the kernel log's OOM-killer lines
(``dmesg``, else /var/log/kern.log). Nothing here fails: what cannot be read is said to be not readable."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from gateway.cli.check.readings import HostReadings
from gateway.cli.check.signatures import SIGNATURES
from gateway.memory.host_ram import MEMINFO_PATH, HostRamUnavailable, read_host_ram

KERN_LOGS = (Path("/var/log/kern.log"), Path("/var/log/messages"))
_OOM = next(s.pattern for s in SIGNATURES if s.code == "oom_killer")


def _dmesg(command: Sequence[str]) -> tuple[str | None, str]:
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=3.0,  # noqa: S603
                              check=False)  # the command is kvgate's own (dmesg), never input
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{command[0]}: {exc}"
    if done.returncode != 0:
        return None, f"{command[0]}: {(done.stderr.strip() or f'exit {done.returncode}')[:120]}"
    return done.stdout, ""


def read_kernel_oom(
    dmesg: Sequence[str] | None = ("dmesg",), files: Sequence[Path] = KERN_LOGS
) -> tuple[tuple[str, ...], str | None, str]:
    """(OOM-killer lines, why not readable or None, where they were read)."""
    problems = []
    if dmesg:
        text, problem = _dmesg(dmesg)
        if text is not None:
            return tuple(line for line in text.splitlines() if _OOM.search(line)), None, "dmesg"
        problems.append(problem)
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        return tuple(line for line in text.splitlines()[-20000:] if _OOM.search(line)), None, str(path)
    return (), "; ".join(problems) or "no kernel log source", ""


def read_host(
    meminfo: Path = MEMINFO_PATH, dmesg: Sequence[str] | None = ("dmesg",), kern_logs: Sequence[Path] = KERN_LOGS
) -> HostReadings:
    try:
        ram, ram_problem = read_host_ram(meminfo), None
    except HostRamUnavailable as exc:
        ram, ram_problem = None, str(exc)
    lines, problem, source = read_kernel_oom(dmesg, kern_logs)
    return HostReadings(ram=ram, ram_problem=ram_problem, kernel_oom_lines=lines, kernel_problem=problem,
                        kernel_source=source)
