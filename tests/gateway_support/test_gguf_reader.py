"""The GGUF reader: agreement with gguf.GGUFReader, counted long arrays, the key/value digest, bad files."""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from gateway.support.gguf_reader import GgufFormatError, parse_gguf_metadata, read_gguf, read_gguf_metadata
from tests.tokens.vocab_vectors import VOCAB_DIR, vocab_path


class _PlainArrayReader(gguf.GGUFReader):
    """gguf.GGUFReader reading the same mapped bytes through a plain ndarray view of its np.memmap: the reader slices
    its data once per array element (tokens, scores, types, merges), and np.memmap's per-slice bookkeeping made
    that 2-3 s a vocabulary; the fields it builds are the same, in a fifth of the time."""

    @property  # type: ignore[override]  # the memmap's bytes, as a plain ndarray
    def data(self) -> np.ndarray[Any, Any]:
        return self._plain

    @data.setter
    def data(self, value: np.ndarray[Any, Any]) -> None:
        self._plain = value.view(np.ndarray)


@functools.cache
def _reference(path: Path) -> gguf.GGUFReader:
    """The gguf package's reading of ``path``, once per test run (the tests below only read it)."""
    return _PlainArrayReader(path)


@pytest.mark.parametrize("vocab", ["llama-spm", "phi-3", "deepseek-coder"])
def test_metadata_matches_gguf_reader(vocab: str) -> None:
    ours = read_gguf_metadata(vocab_path(vocab)).values
    reader = _reference(vocab_path(vocab))
    theirs = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value) if isinstance(value, float) else ours[key] == value, key


def test_reader_agrees_with_gguf_reader() -> None:
    path = VOCAB_DIR / "ggml-vocab-llama-spm.gguf"
    ours = read_gguf(path).metadata
    reference = _reference(path)
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            assert ours[key + ".count"] == len(field.data)
        else:
            assert ours[key] == pytest.approx(field.contents()), key


def test_keep_arrays_reads_what_the_metadata_reader_reads() -> None:
    path = vocab_path("phi-3")
    assert read_gguf(path, keep_arrays=True).metadata == read_gguf_metadata(path).values


def test_kv_digest_is_stable_across_copies(tmp_path: Path) -> None:
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(vocab_path("phi-3").read_bytes())
    assert read_gguf_metadata(copy).kv_digest == read_gguf_metadata(vocab_path("phi-3")).kv_digest


def test_big_endian_file_reads_like_little_endian() -> None:
    def image(endian: str) -> bytes:
        key, text = b"general.name", b"tiny"
        return b"".join([
            b"GGUF", struct.pack(endian + "IQQ", 3, 0, 2),
            struct.pack(endian + "Q", len(key)), key, struct.pack(endian + "IQ", 8, len(text)), text,
            struct.pack(endian + "Q", 3), b"arr", struct.pack(endian + "IIQ", 9, 5, 2),
            struct.pack(endian + "ii", 7, -1),
        ])  # fmt: skip

    little, big = parse_gguf_metadata(image("<")), parse_gguf_metadata(image(">"))
    assert little.values == big.values == {"general.name": "tiny", "arr": [7, -1]}


def test_truncated_gguf_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(vocab_path("phi-3").read_bytes()[:5000])
    with pytest.raises(GgufFormatError, match=r"broken\.gguf"):
        read_gguf_metadata(broken)
    with pytest.raises(GgufFormatError, match=r"broken\.gguf"):
        read_gguf(broken)


def test_reader_refuses_a_non_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"not a gguf file at all, really")
    with pytest.raises(GgufFormatError, match="no GGUF magic"):
        read_gguf(path)
    with pytest.raises(GgufFormatError, match="no GGUF magic"):
        read_gguf_metadata(path)
