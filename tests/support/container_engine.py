"""A container engine for the container tests (tests/deploy/), podman's or docker's CLI, or why none can run here.

``find_engine(base)`` tries podman, then docker: the CLI is installed, ``info`` answers (docker's needs a daemon),
the base image is here or can be pulled, and a container of it runs. The first that passes all four is used; else
the answer is the reason each one failed, as the engine said it, for the test's skip.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

ENGINES = ("podman", "docker")
INFO_TIMEOUT_S = 30
PULL_TIMEOUT_S = 120


def _said(done: subprocess.CompletedProcess[str]) -> str:
    """The last line the engine wrote (its error), or its exit status."""
    lines = (done.stderr or done.stdout or "").strip().splitlines()
    return lines[-1].strip() if lines else f"exit status {done.returncode}"


@dataclass(frozen=True)
class Engine:
    """One engine's CLI (``podman`` or ``docker``, the same commands for what the tests do)."""

    program: str

    def run(self, *args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.program, *args], capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise AssertionError(f"{self.program} {' '.join(args)} failed ({done.returncode}):\n"
                                 f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return done

    def published(self, container: str, port: str) -> str:
        """``HOST:PORT`` where the container's ``port`` (``11435/tcp``) is published."""
        return self.run("port", container, port).stdout.strip().splitlines()[0]


def _usable(program: str, base: str) -> Engine | str:
    if shutil.which(program) is None:
        return f"{program}: not installed"
    engine = Engine(program)
    try:
        info = engine.run("info", timeout_s=INFO_TIMEOUT_S, check=False)
        if info.returncode != 0:
            return f"{program}: `{program} info` failed: {_said(info)}"
        if engine.run("image", "inspect", base, check=False).returncode != 0:
            pulled = engine.run("pull", base, timeout_s=PULL_TIMEOUT_S, check=False)
            if pulled.returncode != 0:
                return f"{program}: the base image {base} is not here and cannot be pulled: {_said(pulled)}"
        ran = engine.run("run", "--rm", "--network", "none", base, "true", check=False)
        if ran.returncode != 0:
            return f"{program}: cannot run a container of {base}: {_said(ran)}"
    except subprocess.TimeoutExpired as exc:
        return f"{program}: `{' '.join(map(str, exc.cmd))}` did not answer in {exc.timeout:.0f} s"
    return engine


def find_engine(base: str) -> Engine | str:
    """The first engine that can build FROM ``base`` and run it here, or why none can (one clause per engine)."""
    reasons = []
    for program in ENGINES:
        found = _usable(program, base)
        if isinstance(found, Engine):
            return found
        reasons.append(found)
    return "no container engine can run the image here: " + "; ".join(reasons)
