"""A directory of converted tokenizers (tokenizer.json files), keyed by a digest of their source.

The key is whatever identifies the vocabulary: the digest of a GGUF file's key/value section, or an Ollama model
digest. A converter version is part of the file name, so a change to the conversion never serves a stale file.
Writes go to a temporary file first and are renamed into place, so a reader never sees half a file; a corrupt
file is treated as a miss and rebuilt.

The digest of a GGUF file's key/value section takes reading every vocabulary string (about a second for Gemma-4's
780K), so the directory also keeps a small index from a file's identity (resolved path, size, mtime, ctime, inode,
device) to its cache key: `file_key` answers from it without reading the file, and an entry is trusted only while
that identity is unchanged (a touched or rewritten file is read again and re-keyed). An entry is only written for a
file last modified a while before it was read (`_SETTLED_NS`): a file written again within the same timestamp tick
could otherwise keep its identity with other contents.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
import tokenizers

CONVERTER_VERSION = 1
LOADED_KEPT = 4
"""Tokenizers loaded from this process's cache files, kept for the next load of the same unchanged file (a
configuration reload, a second app in one process): reading a tokenizer.json costs nearly as much as converting it
(0.7 s for Llama 3's). Never mutated by kvgate, so one object serves every counter of that vocabulary."""
_LOADED: OrderedDict[tuple[str, int, int, int], tokenizers.Tokenizer] = OrderedDict()
_SAFE_KEY = re.compile(r"[^A-Za-z0-9._-]+")

_INDEX_VERSION = 1
_SETTLED_NS = 2_000_000_000  # a file modified less than this before it was read is not indexed

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What says a file is still the one that was read: while all of it is unchanged, so are its contents."""

    path: str  # resolved
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        """The identity of `path` now; raises OSError as `os.stat` does."""
        resolved = path.resolve()
        st = resolved.stat()
        return cls(str(resolved), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _remember(identity: tuple[str, int, int, int], tokenizer: tokenizers.Tokenizer) -> None:
    """Keep a loaded tokenizer for every later loader of the same file in this process (a second backend serving
    the same model reads it in microseconds, not the half second a 128K vocabulary takes to parse)."""
    _LOADED[identity] = tokenizer
    _LOADED.move_to_end(identity)
    while len(_LOADED) > LOADED_KEPT:
        _LOADED.popitem(last=False)


class TokenizerCache:
    """tokenizer.json files under one directory; `get_or_build` converts at most once per key."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path_for(self, key: str) -> Path:
        safe = _SAFE_KEY.sub("-", key).strip("-.") or "empty"
        return self.directory / f"{safe[:128]}.v{CONVERTER_VERSION}.tokenizer.json"

    def load(self, key: str) -> tokenizers.Tokenizer | None:
        path = self.path_for(key)
        try:
            stat = path.stat()
        except OSError:
            return None
        if not path.is_file():
            return None
        identity = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
        loaded = _LOADED.get(identity)
        if loaded is not None:
            _LOADED.move_to_end(identity)
            return loaded
        try:
            loaded = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # a truncated or foreign file: rebuild it
            log.warning("ignoring unreadable cached tokenizer %s: %s", path, exc)
            return None
        _remember(identity, loaded)
        return loaded

    def store(self, key: str, tokenizer_json: str | bytes) -> Path:
        path = self.path_for(key)
        self._write(path, tokenizer_json.encode() if isinstance(tokenizer_json, str) else tokenizer_json)
        return path

    def _write(self, path: Path, data: bytes) -> None:
        """Write through a temporary file renamed into place: a reader sees the old file or the new one."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    def get_or_build(self, key: str, build_json: Callable[[], str]) -> tokenizers.Tokenizer:
        cached = self.load(key)
        if cached is not None:
            return cached
        text = build_json()
        tokenizer = tokenizers.Tokenizer.from_str(text)
        self.store_or_warn(key, text)
        path = self.path_for(key)
        try:  # the file just written is the one the next loader of this key (another backend's chain) reads
            stat = path.stat()
        except OSError:
            return tokenizer
        _remember((str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino), tokenizer)
        return tokenizer

    def file_key(self, path: Path) -> str | None:
        """The key `remember_file_key` recorded for `path`, if the file is unchanged since; else None (read it)."""
        try:
            identity = FileIdentity.of(path)
            entry = orjson.loads(self._index_path(identity.path).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(entry, dict) or entry.get("v") != _INDEX_VERSION or not isinstance(entry.get("key"), str):
            return None  # a foreign or damaged entry: read the file
        if entry.get("file") != asdict(identity):
            return None
        return str(entry["key"])

    def remember_file_key(self, identity: FileIdentity, key: str) -> None:
        """Record that the file of `identity` (taken BEFORE reading it) has cache key `key`; failures only log.

        A file modified less than `_SETTLED_NS` before `identity` was taken is not recorded (it is read again next
        time), so a rewrite within one timestamp tick is never mistaken for the file that was read.
        """
        if time.time_ns() - identity.mtime_ns < _SETTLED_NS:
            return
        entry = {"v": _INDEX_VERSION, "key": key, "file": asdict(identity)}
        try:
            self._write(self._index_path(identity.path), orjson.dumps(entry))
        except OSError as exc:
            log.warning("cannot write tokenizer cache index for %s: %s", identity.path, exc)

    def _index_path(self, resolved: str) -> Path:
        name = hashlib.sha256(os.fsencode(resolved)).hexdigest()[:32]
        return self.directory / f"file-{name}.v{_INDEX_VERSION}.key.json"

    def store_or_warn(self, key: str, tokenizer_json: str | bytes) -> None:
        """`store`, where a cache that cannot be written only logs: the caller has a working tokenizer anyway."""
        try:
            self.store(key, tokenizer_json)
        except OSError as exc:
            log.warning("cannot write tokenizer cache %s: %s", self.path_for(key), exc)
