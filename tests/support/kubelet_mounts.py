"""A ConfigMap or Secret volume laid out as the kubelet lays it out: each file a symlink through ``..data`` to a
timestamped directory, and a new version published by one atomic swap of that symlink (every file changes at
once, and a reader that follows the links never sees half of a version)."""

from __future__ import annotations

import os
from pathlib import Path


def publish(directory: Path, version: int, files: dict[str, str]) -> None:
    """Publish ``files`` in ``directory`` as the volume's version ``version`` (1, 2, ...)."""
    data = directory / f"..2026_12_03_00_00_{version:02d}.000000000"
    data.mkdir(parents=True)
    for name, text in files.items():
        (data / name).write_text(text)
    (directory / "..data_tmp").symlink_to(data.name)
    os.replace(directory / "..data_tmp", directory / "..data")  # the swap
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(Path("..data") / name)
