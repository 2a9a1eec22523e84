"""A directory of converted tokenizers (tokenizer.json files), keyed by a digest of their source.

The key is whatever identifies the vocabulary: the digest of a GGUF file's key/value section, or an Ollama model
digest. A converter version is part of the file name, so a change to the conversion never serves a stale file.
Writes go to a temporary file first and are renamed into place, so a reader never sees half a file; a corrupt
file is treated as a miss and rebuilt.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import tokenizers

CONVERTER_VERSION = 1
_SAFE_KEY = re.compile(r"[^A-Za-z0-9._-]+")

log = logging.getLogger(__name__)


class TokenizerCache:
    """tokenizer.json files under one directory; `get_or_build` converts at most once per key."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path_for(self, key: str) -> Path:
        safe = _SAFE_KEY.sub("-", key).strip("-.") or "empty"
        return self.directory / f"{safe[:128]}.v{CONVERTER_VERSION}.tokenizer.json"

    def load(self, key: str) -> tokenizers.Tokenizer | None:
        path = self.path_for(key)
        if not path.is_file():
            return None
        try:
            return tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # a truncated or foreign file: rebuild it
            log.warning("ignoring unreadable cached tokenizer %s: %s", path, exc)
            return None

    def store(self, key: str, tokenizer_json: str | bytes) -> Path:
        path = self.path_for(key)
        self.directory.mkdir(parents=True, exist_ok=True)
        data = tokenizer_json.encode() if isinstance(tokenizer_json, str) else tokenizer_json
        fd, tmp_name = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return path

    def get_or_build(self, key: str, build_json: Callable[[], str]) -> tokenizers.Tokenizer:
        cached = self.load(key)
        if cached is not None:
            return cached
        text = build_json()
        tokenizer = tokenizers.Tokenizer.from_str(text)
        self.store_or_warn(key, text)
        return tokenizer

    def store_or_warn(self, key: str, tokenizer_json: str | bytes) -> None:
        """`store`, where a cache that cannot be written only logs: the caller has a working tokenizer anyway."""
        try:
            self.store(key, tokenizer_json)
        except OSError as exc:
            log.warning("cannot write tokenizer cache %s: %s", self.path_for(key), exc)
