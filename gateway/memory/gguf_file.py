"""Read the metadata of a GGUF file without loading its tensors.

gguf.GGUFReader builds a Python object per array element, which takes ~20 s for a 262k-token vocabulary; this
reader walks the same format (GGUF v2/v3, little-endian) over a memory map and skips the big tokenizer arrays,
keeping only their length (``<key>.count``). Tensor byte sizes use gguf's ``GGML_QUANT_SIZES`` table.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_KEEP_ARRAY_MAX = 4096  # per-layer arrays are short; longer ones (tokens, merges, scores) are only counted


class GgufFormatError(ValueError):
    """Raised when a file is not a GGUF file this reader understands."""


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


@dataclass(frozen=True)
class _LongArray:
    count: int


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, keep_array_max: int) -> None:
        self.buf = buf
        self.pos = 0
        self.keep_array_max = keep_array_max

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GgufFormatError("file ends in the middle of the metadata")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.unpack("<Q")
        self.pos += n

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            return self.array()
        fmt = _SCALARS.get(value_type)
        if fmt is None:
            raise GgufFormatError(f"unknown GGUF value type {value_type}")
        return self.unpack(fmt)

    def array(self) -> list[Any] | _LongArray:
        """The elements, or only their count for a long array (skipped without decoding)."""
        elem_type = self.unpack("<I")
        count = self.unpack("<Q")
        if count > self.keep_array_max:
            if elem_type == _STRING:
                for _ in range(count):
                    self.skip_string()
            elif elem_type in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[elem_type])
            else:
                for _ in range(count):
                    self.value(elem_type)
            return _LongArray(count)
        return [self.value(elem_type) for _ in range(count)]


def _tensor_bytes(dims: list[int], ggml_type: int) -> int:
    n_elements = 1
    for dim in dims:
        n_elements *= dim
    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError) as exc:
        raise GgufFormatError(f"unknown ggml tensor type {ggml_type}") from exc
    return int(n_elements * type_size // block)


def parse_gguf(buf: mmap.mmap | bytes, *, keep_arrays: bool = False) -> tuple[dict[str, Any], int, int]:
    """(metadata, tensor count, tensor bytes) of a GGUF image; long arrays only counted unless keep_arrays."""
    cur = _Cursor(buf, 2**63 if keep_arrays else _KEEP_ARRAY_MAX)
    if bytes(buf[:4]) != b"GGUF":
        raise GgufFormatError("no GGUF magic at the start")
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise GgufFormatError(f"GGUF version {version} is not supported (2 or 3, little-endian)")
    n_tensors = cur.unpack("<Q")
    n_kv = cur.unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        value = cur.value(cur.unpack("<I"))
        if isinstance(value, _LongArray):
            metadata[key + ".count"] = value.count
        else:
            metadata[key] = value
    tensor_bytes = 0
    for _ in range(n_tensors):
        cur.skip_string()
        n_dims = cur.unpack("<I")
        dims = [cur.unpack("<Q") for _ in range(n_dims)]
        ggml_type = cur.unpack("<I")
        cur.unpack("<Q")  # offset
        tensor_bytes += _tensor_bytes(dims, ggml_type)
    return metadata, n_tensors, tensor_bytes


def read_gguf(path: str | Path, *, keep_arrays: bool = False) -> GgufSummary:
    """Metadata (long arrays only counted unless keep_arrays), tensor bytes and file size of a GGUF file."""
    file_path = Path(path)
    with file_path.open("rb") as handle:
        stat = Path(handle.name).stat()
        if stat.st_size < 24:
            raise GgufFormatError(f"{file_path} is too small to be a GGUF file ({stat.st_size} bytes)")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                metadata, n_tensors, tensor_bytes = parse_gguf(buf, keep_arrays=keep_arrays)
            except GgufFormatError as exc:
                raise GgufFormatError(f"{file_path}: {exc}") from exc
    return GgufSummary(
        path=file_path,
        metadata=metadata,
        tensor_bytes=tensor_bytes,
        file_bytes=stat.st_size,
        tensor_count=n_tensors,
        mtime_ns=stat.st_mtime_ns,
    )
