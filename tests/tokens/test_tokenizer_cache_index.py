"""The tokenizer cache's file index: a cached GGUF tokenizer loads without reading the GGUF file again, only while
the file is unchanged (size, mtime, ctime, inode, device)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import pytest

import gateway.tokens.gguf_vocab as gguf_vocab
from gateway.support.gguf_reader import GgufMetadata, read_gguf_metadata
from gateway.tokens.gguf_vocab import load_gguf_tokenizer
from gateway.tokens.tokenizer_cache import TokenizerCache
from tests.tokens.vocab_vectors import vocab_path

TEXT = "Hello world, 1234567 tokens!"
AN_HOUR_AGO_NS = time.time_ns() - 3600 * 10**9


class Reads(list[Path]):
    """The GGUF files load_gguf_tokenizer parsed, in order: pass it as ``read_metadata=``."""

    def __call__(self, path: Path) -> GgufMetadata:
        self.append(path)
        return read_gguf_metadata(path)


@pytest.fixture
def reads() -> Reads:
    return Reads()


def _model(tmp_path: Path, vocab: str = "llama-spm", *, mtime_ns: int = AN_HOUR_AGO_NS) -> Path:
    path = tmp_path / "models" / "model.gguf"
    path.parent.mkdir(exist_ok=True)
    shutil.copyfile(vocab_path(vocab), path)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def _index_entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("file-*.key.json"))


def test_a_hit_does_not_read_the_gguf_file(tmp_path: Path, reads: Reads) -> None:
    model, cache_dir = _model(tmp_path), tmp_path / "cache"
    first = load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    assert reads == [model] and len(_index_entries(cache_dir)) == 1
    key = f"gguf-{read_gguf_metadata(model).kv_digest}"
    assert TokenizerCache(cache_dir).file_key(model) == key  # the key a read gives
    second = load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    assert reads == [model]  # not read again
    assert second.encode(TEXT).ids == first.encode(TEXT).ids
    # the same file through another path (a symlink) is the same resolved file
    link = tmp_path / "link.gguf"
    link.symlink_to(model)
    load_gguf_tokenizer(link, cache_dir=cache_dir, read_metadata=reads)
    assert reads == [model]


def test_a_touched_file_is_read_again_and_re_keyed(tmp_path: Path, reads: Reads) -> None:
    model, cache_dir = _model(tmp_path), tmp_path / "cache"
    load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    os.utime(model, ns=(AN_HOUR_AGO_NS + 10**9, AN_HOUR_AGO_NS + 10**9))  # touched: same contents, new mtime
    assert TokenizerCache(cache_dir).file_key(model) is None
    load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    assert reads == [model, model]
    load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)  # re-keyed: trusted again
    assert reads == [model, model] and len(_index_entries(cache_dir)) == 1


def test_a_file_replaced_by_another_model_gives_the_other_tokenizer(tmp_path: Path, reads: Reads) -> None:
    model, cache_dir = _model(tmp_path, "llama-spm"), tmp_path / "cache"
    spm = load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    replacement = tmp_path / "replacement.gguf"
    shutil.copyfile(vocab_path("gpt-2"), replacement)
    os.utime(replacement, ns=(AN_HOUR_AGO_NS, AN_HOUR_AGO_NS))  # even with the same mtime
    os.replace(replacement, model)
    gpt2 = load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    assert reads == [model, model]
    assert gpt2.encode(TEXT).ids != spm.encode(TEXT).ids
    assert gpt2.encode(TEXT).ids == load_gguf_tokenizer(vocab_path("gpt-2")).encode(TEXT).ids


def test_a_file_rewritten_in_place_with_its_size_and_mtime_kept_is_read_again(
    tmp_path: Path, reads: Reads
) -> None:
    model, cache_dir = _model(tmp_path), tmp_path / "cache"
    load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    data = bytearray(model.read_bytes())
    name = data.find(b"general.name")
    assert name > 0
    data[name + 40] ^= 0x01  # inside the name's value or the next key: the key/value digest changes
    with model.open("r+b") as fh:  # same inode, same size
        fh.write(data)
    os.utime(model, ns=(AN_HOUR_AGO_NS, AN_HOUR_AGO_NS))  # and the old mtime back: only the ctime tells
    assert TokenizerCache(cache_dir).file_key(model) is None
    # what the flipped bit did to the file does not matter here, only that the file was read
    with contextlib.suppress(gguf_vocab.UnsupportedTokenizer):
        load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    assert reads == [model, model]


@pytest.mark.parametrize("junk", [b"{not json", b"[]", b'{"v": 1, "key": 7}', b'{"v": 99, "key": "gguf-x", "file": {}}',
                                  b""], ids=["not-json", "a-list", "key-not-a-string", "other-version", "empty"])
def test_a_corrupt_or_foreign_index_entry_is_ignored(tmp_path: Path, reads: Reads, junk: bytes) -> None:
    model, cache_dir = _model(tmp_path), tmp_path / "cache"
    expected = load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads).encode(TEXT).ids
    (entry,) = _index_entries(cache_dir)
    entry.write_bytes(junk)
    assert TokenizerCache(cache_dir).file_key(model) is None
    assert load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads).encode(TEXT).ids == expected
    assert len(reads) == 2
    load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)  # the read wrote a sound entry back
    assert len(reads) == 2


def test_an_index_entry_whose_tokenizer_is_gone_converts_again(tmp_path: Path, reads: Reads) -> None:
    model, cache_dir = _model(tmp_path), tmp_path / "cache"
    load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    for converted in cache_dir.glob("*.tokenizer.json"):
        converted.unlink()
    assert load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads).encode(TEXT).ids
    assert reads == [model, model]
    assert len(list(cache_dir.glob("*.tokenizer.json"))) == 1


def test_a_file_modified_just_now_is_not_indexed(tmp_path: Path, reads: Reads) -> None:
    """Within one timestamp tick a rewrite can keep the identity: a just-written file is read until it settles."""
    model, cache_dir = _model(tmp_path, mtime_ns=time.time_ns()), tmp_path / "cache"
    load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    load_gguf_tokenizer(model, cache_dir=cache_dir, read_metadata=reads)
    assert reads == [model, model] and not _index_entries(cache_dir)


def test_a_loaded_tokenizer_is_kept_for_the_next_load_of_the_unchanged_file(tmp_path: Path) -> None:
    """Reading a tokenizer.json costs nearly as much as converting it: the process keeps the few it loaded last,
    by file identity, so a rewritten file is read again and a removed one is a miss."""
    cache = TokenizerCache(tmp_path)
    document = load_gguf_tokenizer(vocab_path("llama-spm")).to_str()
    cache.store("k", document)
    first = cache.load("k")
    assert first is not None and cache.load("k") is first
    path = cache.path_for("k")
    os.utime(path, ns=(AN_HOUR_AGO_NS, AN_HOUR_AGO_NS))  # another identity: read anew
    again = cache.load("k")
    assert again is not None and again is not first and again.encode(TEXT).ids == first.encode(TEXT).ids
    path.unlink()
    assert cache.load("k") is None
