"""The environment a kvgate container starts with: the image's ``ENV`` (the Dockerfile's), which a deployment's own
variables add to. The deployment tests load kvgate's settings under
it, since a variable the image sets (``KVGATE_BACKEND__URL``) changes what a configuration file means."""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

DOCKERFILE = Path(__file__).parents[2] / "Dockerfile"


def image_environment() -> dict[str, str]:
    """The variables the Dockerfile's ``ENV`` lines set."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    variables: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            variables |= dict(word.split("=", 1) for word in shlex.split(line[4:]))
    return variables


@contextlib.contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """Exactly these ``KVGATE_*`` variables while the block runs (the test's own are put back after)."""
    saved = {name: value for name, value in os.environ.items() if name.startswith("KVGATE_")}
    for name in saved:
        del os.environ[name]
    os.environ.update(variables)
    try:
        yield
    finally:
        for name in variables:
            os.environ.pop(name, None)
        os.environ.update(saved)
