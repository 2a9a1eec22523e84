"""The Dockerfile's steps replayed outside a container engine, for where none can run (tests/deploy/test_container.py).

A temporary directory stands for the image's ``/``, a fresh virtual environment at its ``usr/local`` for the base
image's Python (python:3.12-slim keeps its Python there), and every absolute path the image names (COPY destinations,
WORKDIR, ENV values, CMD arguments) is read under that directory. COPY copies exactly its sources, less what
.dockerignore leaves out of the build context; each RUN command is run by a replayer of its own. What cannot run
unprivileged on the host is skipped, said in ``Replayed.skipped`` with the reason, and checked as far as it can be
(``chown`` names a user the RUN added, a path it made). A RUN command without a replayer fails the replay: a new
step in the Dockerfile is never skipped in silence.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tests.support.dockerfile import Copy, DockerfileError, Image, Run, ignore_patterns, ignored

PIP_INSTALL_TIMEOUT_S = 600
HOST_PIP_VARIABLES = ("HOME", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
                      "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
"""Passed to pip from the host, beside its PIP_* variables: where the index is and how it is reached (a mirror, a
proxy) is the host's, as the engine's build network is; HOME keeps pip's cache, so the install takes seconds."""


@dataclass
class Replayed:
    """An image replayed under ``root``: its ``/`` (``path``), its environment (``env``), what it runs (``argv``)."""

    image: Image
    root: Path
    skipped: list[str] = field(default_factory=list)
    users: set[str] = field(default_factory=set)
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def bin(self) -> Path:
        return self.root / "usr" / "local" / "bin"

    def path(self, image_path: str) -> Path:
        """Where the image's absolute ``image_path`` is here."""
        return self.root / str(PurePosixPath("/", image_path)).lstrip("/")

    def mapped(self, value: str) -> str:
        """``value``, an absolute path of the image read under ``root``; anything else unchanged."""
        return str(self.path(value)) if value.startswith("/") else value

    def env(self, base: Mapping[str, str] | None = None, **changes: str) -> dict[str, str]:
        """The image's environment (``base``, by default its final ENV), its paths mapped, PATH through the
        image's Python first, then ``changes``."""
        env = {name: self.mapped(value) for name, value in (self.image.env if base is None else base).items()}
        return {**env, "PATH": f"{self.bin}:/usr/bin:/bin", **changes}

    def resolve(self, argv: tuple[str, ...]) -> list[str]:
        """An argv as the image would run it: its program looked up on the image's PATH (an absolute one the steps
        did not make, such as /bin/sh, is the base image's own, which the host's stands for), its absolute
        arguments mapped."""
        program = shutil.which(argv[0], path=self.env()["PATH"]) if "/" not in argv[0] else argv[0]
        if program is not None and program.startswith("/") and Path(self.mapped(program)).is_file():
            program = self.mapped(program)
        if program is None:
            raise FileNotFoundError(f"{argv[0]!r} is neither in the image's Python ({self.bin}) nor /usr/bin, /bin")
        return [program, *(self.mapped(arg) for arg in argv[1:])]


def replay(image: Image, context: Path, root: Path, *, python: str = sys.executable) -> Replayed:
    """Run the image's steps under ``root`` from the build ``context``; the base image's Python is a fresh virtual
    environment made by ``python``."""
    patterns = ignore_patterns(context)
    for step in image.steps:  # before the slow part: an unknown command or a missing source fails at once
        for command in step.commands if isinstance(step, Run) else ():
            if command[0] not in _COMMANDS:
                raise DockerfileError(f"RUN {' '.join(command)}: no replayer for {command[0]!r} in "
                                      f"tests/support/image_replay.py; add one (or run the image in an engine)")
        for source in step.sources if isinstance(step, Copy) else ():
            if not (context / source).exists():
                raise DockerfileError(f"COPY {source}: no such path in the build context {context}")
            if ignored(PurePosixPath(source), patterns):
                raise DockerfileError(f"COPY {source}: .dockerignore leaves it out of the build context")
    replayed = Replayed(image, root)
    started = time.monotonic()
    subprocess.run([python, "-m", "venv", str(root / "usr" / "local")], check=True, timeout=120)
    replayed.timings_s["venv"] = time.monotonic() - started
    for step in image.steps:
        if isinstance(step, Copy):
            _copy(step, context, replayed, patterns)
        else:
            for command in step.commands:
                _COMMANDS[command[0]](command, step, replayed)
    return replayed


def _copy(step: Copy, context: Path, replayed: Replayed, patterns: list[re.Pattern[str]]) -> None:
    for source in step.sources:
        path = context / source
        if path.is_dir():  # a directory's contents, not the directory itself, as the engines copy
            target = replayed.path(step.dest)
            for found in sorted(path.rglob("*")):
                relative = PurePosixPath(found.relative_to(context).as_posix())
                if found.is_file() and not ignored(relative, patterns):
                    destination = target / found.relative_to(path)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(found, destination)
        else:
            destination = replayed.path(step.dest) / path.name if step.into_directory else replayed.path(step.dest)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination)


def _pip(command: tuple[str, ...], step: Run, replayed: Replayed) -> None:
    """``pip ...`` with the image's Python, in the WORKDIR, with the ENV of that point in the Dockerfile, but for
    PIP_NO_CACHE_DIR: pip's cache on the host is kept (the install takes ~25 s with it) and the image's layer size is
    no concern here."""
    host = {name: value for name, value in os.environ.items()
            if name.startswith("PIP_") or name in HOST_PIP_VARIABLES}  # fmt: skip
    env = {**host, **replayed.env(step.env)}
    env.pop("PIP_NO_CACHE_DIR", None)
    started = time.monotonic()
    done = subprocess.run([str(replayed.bin / "python"), "-m", "pip", *command[1:]], cwd=replayed.path(step.workdir),
                          env=env, capture_output=True, text=True, timeout=PIP_INSTALL_TIMEOUT_S)  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"RUN {' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                             f"{done.stderr[-3000:]}")
    replayed.timings_s["pip"] = replayed.timings_s.get("pip", 0.0) + time.monotonic() - started
    replayed.skipped.append("PIP_NO_CACHE_DIR=1 for pip: pip's cache on this machine is used")


def _useradd(command: tuple[str, ...], step: Run, replayed: Replayed) -> None:
    """Not run: it would add a user to this machine (and needs root). The name is kept for USER and ``chown``."""
    replayed.users.add(command[-1])
    replayed.skipped.append(f"{' '.join(command)}: not run (it would add a user to this machine); the test runs as "
                            f"the user it is")


def _mkdir(command: tuple[str, ...], step: Run, replayed: Replayed) -> None:
    flags = [word for word in command[1:] if word.startswith("-")]
    if set(flags) - {"-p"}:
        raise DockerfileError(f"RUN {' '.join(command)}: only mkdir -p is replayed")
    for directory in (word for word in command[1:] if not word.startswith("-")):
        (replayed.path(str(PurePosixPath(step.workdir, directory)))).mkdir(parents=True, exist_ok=True)


def _chown(command: tuple[str, ...], step: Run, replayed: Replayed) -> None:
    """Not run (the owner exists in the image only); checked: the owner is one the RUN added, the paths exist."""
    words = [word for word in command[1:] if not word.startswith("-")]
    if len(words) < 2 or len(words) != len(command) - 1:
        raise DockerfileError(f"RUN {' '.join(command)}: only chown OWNER PATH... is replayed")
    owner, *paths = words
    if owner.split(":")[0] not in replayed.users:
        raise DockerfileError(f"RUN {' '.join(command)}: {owner!r} is not a user an earlier useradd made")
    for path in paths:
        if not replayed.path(str(PurePosixPath(step.workdir, path))).exists():
            raise DockerfileError(f"RUN {' '.join(command)}: {path} does not exist at that point")
    replayed.skipped.append(f"{' '.join(command)}: not run (the user exists in the image only)")


_COMMANDS: dict[str, Callable[[tuple[str, ...], Run, Replayed], None]] = {
    "pip": _pip, "useradd": _useradd, "mkdir": _mkdir, "chown": _chown}  # fmt: skip
