"""Read the header and key/value section of a GGUF file without loading its tensors.

`gguf.GGUFReader` builds a numpy view (and a Python object) for every element of every array before it returns,
which takes ~11 s for the Llama-3 vocabulary (400K strings) and ~24 s for Gemma-4 on a 2-core machine. This reader
walks the same layout over a memory map with `struct` (and numpy for numeric arrays):

    magic "GGUF" | version (2, 3) | tensor count | key/value count | key/values ... | tensor infos ... | data

Two readers of the same walk:

    read_gguf_metadata   tokenizers: every key/value with its arrays in full, and a digest of the raw key/value
                         bytes (stable across copies and renames); the tensor infos are never read
    read_gguf            memory: the key/values with long arrays (tokens, merges, scores) only counted as
                         ``<key>.count``, the tensors' byte sizes (gguf's ``GGML_QUANT_SIZES``) and the file size

Both byte orders are read; the results are checked against `GGUFReader` in the tests.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The gguf package and numpy are imported where they are used: importing them costs ~0.15 s of `kvgate serve`
# startup, and most runs never read a GGUF file.

_MAGIC = b"GGUF"
_HEADER_BYTES = 24  # magic, version, tensor count, key/value count

# GGUF value types (gguf.constants.GGUFValueType)
_BOOL, _STRING, _ARRAY = 7, 8, 9
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY_DTYPES = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "u1", 10: "u8", 11: "i8", 12: "f8"}
_COUNT_ONLY_OVER = 4096  # per-layer arrays are short; longer ones (tokens, merges, scores) are only counted

Buffer = mmap.mmap | bytes


class GgufFormatError(ValueError):
    """Raised when a file is not a GGUF file this reader understands, or its header is truncated or malformed."""


@dataclass(frozen=True, slots=True)
class GgufMetadata:
    """The key/values of one GGUF file and a digest of the raw key/value bytes (stable across copies)."""

    values: dict[str, Any]
    kv_digest: str


@dataclass(frozen=True)
class GgufSummary:
    """What a GGUF file tells about memory: its key/values, tensor bytes and file size."""

    path: Path
    metadata: dict[str, Any]
    tensor_bytes: int
    file_bytes: int
    tensor_count: int
    mtime_ns: int

    @property
    def weights_bytes(self) -> int:
        """Bytes of the weights: the tensors when the file has any, else the file size."""
        return self.tensor_bytes if self.tensor_count else self.file_bytes


@dataclass(frozen=True, slots=True)
class _Counted:
    """A long array that was skipped: only its length is kept."""

    count: int


class _Cursor:
    """A position in a GGUF image and the byte order of its numbers."""

    def __init__(self, buf: Buffer, endian: str, *, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos
        self.endian = endian
        self._u32 = struct.Struct(endian + "I")
        self._u64 = struct.Struct(endian + "Q")

    def u32(self) -> int:
        (value,) = self._u32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self) -> int:
        (value,) = self._u64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(value)

    def string(self) -> str:
        length = self.u64()
        end = self.pos + length
        if end > len(self.buf):
            raise GgufFormatError(f"string of {length} bytes runs past the end of the file")
        raw = self.buf[self.pos : end]
        self.pos = end
        return bytes(raw).decode("utf-8", errors="replace")

    def strings(self, count: int, *, keep: bool = True) -> list[str]:
        """`count` strings (an empty list when not `keep`: they are only skipped).

        The walk only slices; the pieces are decoded afterwards in one comprehension (a Gemma-4 vocabulary holds
        ~780K strings, so the per-string work in the loop is what a first conversion waits for).
        """
        buf, unpack, pos, size = self.buf, self._u64.unpack_from, self.pos, len(self.buf)
        pieces: list[bytes] = []
        append = pieces.append
        for _ in range(count):
            length = unpack(buf, pos)[0]
            pos += 8
            if keep:
                append(buf[pos : pos + length])
            pos += length
            if pos > size:
                break
        if pos > size:
            raise GgufFormatError("string array runs past the end of the file")
        self.pos = pos
        return [piece.decode("utf-8", errors="replace") for piece in pieces]

    def scalar(self, value_type: int) -> Any:
        fmt = _SCALAR_FORMATS.get(value_type)
        if fmt is None:
            raise GgufFormatError(f"unknown GGUF value type {value_type}")
        (value,) = struct.unpack_from(self.endian + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def numbers(self, value_type: int, count: int, *, keep: bool = True) -> list[Any]:
        import numpy as np

        dtype = np.dtype(self.endian + _NUMPY_DTYPES[value_type])
        nbytes = dtype.itemsize * count
        if self.pos + nbytes > len(self.buf):
            raise GgufFormatError("numeric array runs past the end of the file")
        start, self.pos = self.pos, self.pos + nbytes
        if not keep:
            return []
        arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=start)
        values: list[Any] = arr.astype(bool).tolist() if value_type == _BOOL else arr.tolist()
        return values

    def value(self, value_type: int, *, count_only_over: int | None = None) -> Any:
        """One value; an array longer than `count_only_over` is skipped and returned as _Counted."""
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            return self.array(count_only_over)
        return self.scalar(value_type)

    def array(self, count_only_over: int | None) -> list[Any] | _Counted:
        item_type = self.u32()
        count = self.u64()
        keep = count_only_over is None or count <= count_only_over
        if item_type == _STRING:
            values: list[Any] = self.strings(count, keep=keep)
        elif item_type in _NUMPY_DTYPES:
            values = self.numbers(item_type, count, keep=keep)
        elif item_type == _ARRAY:
            values = [self.array(count_only_over) for _ in range(count)]
        else:
            raise GgufFormatError(f"unknown GGUF array item type {item_type}")
        return values if keep else _Counted(count)


@dataclass(frozen=True, slots=True)
class _KeyValues:
    values: dict[str, Any]
    tensor_count: int
    cursor: _Cursor  # just past the key/value section: the tensor infos


def _read_key_values(buf: Buffer, *, count_only_over: int | None) -> _KeyValues:
    if len(buf) < _HEADER_BYTES or bytes(buf[:4]) != _MAGIC:
        raise GgufFormatError("no GGUF magic at the start")
    (probe,) = struct.unpack_from("<I", buf, 4)
    cursor = _Cursor(buf, "<" if probe & 0xFFFF else ">", pos=4)  # a big-endian version reads as 0x0N000000
    version = cursor.u32()
    if version not in (2, 3):
        raise GgufFormatError(f"GGUF version {version} is not supported (2 or 3)")
    tensor_count = cursor.u64()
    kv_count = cursor.u64()
    values: dict[str, Any] = {}
    try:
        for _ in range(kv_count):
            key = cursor.string()
            value = cursor.value(cursor.u32(), count_only_over=count_only_over)
            if isinstance(value, _Counted):
                values[key + ".count"] = value.count
            else:
                values[key] = value
    except struct.error as exc:
        raise GgufFormatError(f"file ends in the middle of the metadata: {exc}") from exc
    return _KeyValues(values, tensor_count, cursor)


def _tensor_bytes(cursor: _Cursor, tensor_count: int) -> int:
    total = 0
    try:
        for _ in range(tensor_count):
            cursor.string()  # name
            dims = [cursor.u64() for _ in range(cursor.u32())]
            ggml_type = cursor.u32()
            cursor.u64()  # offset
            total += _bytes_of(dims, ggml_type)
    except struct.error as exc:
        raise GgufFormatError(f"file ends in the middle of the tensor infos: {exc}") from exc
    return total


def _bytes_of(dims: list[int], ggml_type: int) -> int:
    n_elements = 1
    for dim in dims:
        n_elements *= dim
    import gguf

    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError) as exc:
        raise GgufFormatError(f"unknown ggml tensor type {ggml_type}") from exc
    return int(n_elements * type_size // block)


@contextmanager
def _mapped(path: Path) -> Iterator[tuple[mmap.mmap, int, int]]:
    """The file mapped read-only, with its size and mtime; format errors name the file."""
    with path.open("rb") as handle:
        stat = Path(handle.name).stat()
        if stat.st_size < _HEADER_BYTES:
            raise GgufFormatError(f"{path} is too small to be a GGUF file ({stat.st_size} bytes)")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                yield buf, stat.st_size, stat.st_mtime_ns
            except GgufFormatError as exc:
                raise GgufFormatError(f"{path}: {exc}") from exc


def parse_gguf_metadata(buf: Buffer) -> GgufMetadata:
    """Every key/value of a GGUF image, arrays in full, and the digest of the raw key/value bytes."""
    parsed = _read_key_values(buf, count_only_over=None)
    digest = hashlib.sha256(buf[: parsed.cursor.pos]).hexdigest()
    return GgufMetadata(values=parsed.values, kv_digest=digest)


def read_gguf_metadata(path: Path) -> GgufMetadata:
    """Map a GGUF file and parse its key/value section in full (a tokenizer's view); tensors are never read."""
    with _mapped(path) as (buf, _size, _mtime):
        return parse_gguf_metadata(buf)


def read_gguf(path: str | Path, *, keep_arrays: bool = False) -> GgufSummary:
    """Key/values (long arrays only counted unless keep_arrays), tensor bytes and file size of a GGUF file."""
    file_path = Path(path)
    with _mapped(file_path) as (buf, size, mtime_ns):
        parsed = _read_key_values(buf, count_only_over=None if keep_arrays else _COUNT_ONLY_OVER)
        tensor_bytes = _tensor_bytes(parsed.cursor, parsed.tensor_count)
    return GgufSummary(
        path=file_path,
        metadata=parsed.values,
        tensor_bytes=tensor_bytes,
        file_bytes=size,
        tensor_count=parsed.tensor_count,
        mtime_ns=mtime_ns,
    )
