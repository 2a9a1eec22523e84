"""Tiny random-weight GGUF models that a real llama-server loads in well under a second.

The tokenizer is the real one, copied from a vocabulary GGUF in gateway/data/vocab (llama-server.md section 5),
so token counts are realistic; the weights are random, so the text is nonsense. Files are cached by their
parameters: asking twice for the same model costs one write.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from gateway.support.gguf_reader import read_gguf

VOCAB_DIR = Path(__file__).resolve().parents[2] / "gateway" / "data" / "vocab"
DEFAULT_VOCAB = VOCAB_DIR / "ggml-vocab-llama-bpe.gguf"
SUPPORTED_ARCHS = ("llama", "deci", "gemma2", "gemma3")
_GENERATOR_VERSION = 1


def tiny_model_dir() -> Path:
    """Where generated models are cached (KVGATE_TINY_MODEL_DIR, else the system temp dir)."""
    directory = Path(os.environ.get("KVGATE_TINY_MODEL_DIR") or Path(tempfile.gettempdir()) / "kvgate-tiny-models")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@lru_cache(maxsize=4)
def _tokenizer(vocab: Path) -> dict[str, Any]:
    metadata = read_gguf(vocab, keep_arrays=True).metadata
    return {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}


def _add_tokenizer(writer: gguf.GGUFWriter, vocab: Path) -> int:
    tok = _tokenizer(vocab)
    writer.add_tokenizer_model(tok["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in tok:
        writer.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    writer.add_token_list(tok["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.token_type" in tok:
        writer.add_token_types(tok["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.scores" in tok:
        writer.add_token_scores(tok["tokenizer.ggml.scores"])
    if "tokenizer.ggml.merges" in tok:
        writer.add_token_merges(tok["tokenizer.ggml.merges"])
    for key, add in (
        ("tokenizer.ggml.bos_token_id", writer.add_bos_token_id),
        ("tokenizer.ggml.eos_token_id", writer.add_eos_token_id),
    ):
        if key in tok:
            add(int(tok[key]))
    if "tokenizer.ggml.add_bos_token" in tok:
        writer.add_add_bos_token(bool(tok["tokenizer.ggml.add_bos_token"]))
    if "tokenizer.chat_template" in tok:
        writer.add_chat_template(str(tok["tokenizer.chat_template"]))
    return len(tok["tokenizer.ggml.tokens"])


class _Weights:
    """Random f16 matrices and f32 norm vectors, in numpy order (the reverse of ggml's ne)."""

    def __init__(self, writer: gguf.GGUFWriter, seed: int) -> None:
        self.writer = writer
        self.rng = np.random.default_rng(seed)

    def matrix(self, name: str, rows: int, cols: int) -> None:
        values = self.rng.standard_normal((rows, cols), dtype=np.float32) * 0.02
        self.writer.add_tensor(name, values.astype(np.float16))

    def norm(self, name: str, size: int) -> None:
        self.writer.add_tensor(name, np.ones(size, dtype=np.float32))


def _add_tensors(writer: gguf.GGUFWriter, p: dict[str, Any], n_vocab: int) -> None:
    w = _Weights(writer, seed=p["n_layers"] * 1000 + p["n_embd"])
    embd, head, ff, arch = p["n_embd"], p["head_dim"], p["n_ff"], p["arch"]
    w.matrix("token_embd.weight", n_vocab, embd)
    w.norm("output_norm.weight", embd)
    for i, n_kv in enumerate(p["n_head_kv"]):
        w.norm(f"blk.{i}.attn_norm.weight", embd)
        w.matrix(f"blk.{i}.attn_q.weight", p["n_head"] * head, embd)
        w.matrix(f"blk.{i}.attn_k.weight", n_kv * head, embd)
        w.matrix(f"blk.{i}.attn_v.weight", n_kv * head, embd)
        w.matrix(f"blk.{i}.attn_output.weight", embd, p["n_head"] * head)
        w.norm(f"blk.{i}.ffn_norm.weight", embd)
        w.matrix(f"blk.{i}.ffn_gate.weight", ff, embd)
        w.matrix(f"blk.{i}.ffn_up.weight", ff, embd)
        w.matrix(f"blk.{i}.ffn_down.weight", embd, ff)
        if arch in ("gemma2", "gemma3"):
            w.norm(f"blk.{i}.post_attention_norm.weight", embd)
            w.norm(f"blk.{i}.post_ffw_norm.weight", embd)
        if arch == "gemma3":
            w.norm(f"blk.{i}.attn_q_norm.weight", head)
            w.norm(f"blk.{i}.attn_k_norm.weight", head)


def _write(path: Path, p: dict[str, Any], vocab: Path) -> None:
    writer = gguf.GGUFWriter(path, p["arch"])
    writer.add_name(f"kvgate-tiny-{p['arch']}")
    writer.add_context_length(p["n_ctx_train"])
    writer.add_embedding_length(p["n_embd"])
    writer.add_block_count(p["n_layers"])
    writer.add_feed_forward_length(p["n_ff"])
    writer.add_head_count(p["n_head"])
    kv = p["n_head_kv"]
    writer.add_head_count_kv(kv if len(set(kv)) > 1 else kv[0])
    writer.add_key_length(p["head_dim"])
    writer.add_value_length(p["head_dim"])
    writer.add_rope_dimension_count(p["head_dim"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if p["sliding_window"]:
        writer.add_sliding_window(p["sliding_window"])
        if p["swa_pattern"] is not None:
            writer.add_sliding_window_pattern(p["swa_pattern"])
    n_vocab = _add_tokenizer(writer, vocab)
    writer.add_vocab_size(n_vocab)
    _add_tensors(writer, p, n_vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_tiny_model(
    path: Path | str | None = None,
    *,
    arch: str = "llama",
    n_layers: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int | Sequence[int] = 2,
    n_ff: int = 128,
    n_ctx_train: int = 8192,
    head_dim: int | None = None,
    sliding_window: int = 0,
    swa_pattern: Sequence[bool] | None = None,
    vocab: Path = DEFAULT_VOCAB,
) -> Path:
    """Write (or reuse) a tiny model; returns its path.

    ``path`` is the .gguf file to write, or a directory to cache it in under a name derived from the parameters
    (None: ``tiny_model_dir()``). A per-layer ``n_head_kv`` list needs ``arch="deci"`` (llama.cpp's llama
    loader assumes equal heads); sliding windows need gemma2/gemma3.
    """
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported arch {arch!r}; allowed: {', '.join(SUPPORTED_ARCHS)}")
    kv = [n_head_kv] * n_layers if isinstance(n_head_kv, int) else list(n_head_kv)
    if len(kv) != n_layers:
        raise ValueError(f"n_head_kv has {len(kv)} entries; expected {n_layers}")
    params: dict[str, Any] = {
        "arch": arch, "n_layers": n_layers, "n_embd": n_embd, "n_head": n_head, "n_head_kv": kv, "n_ff": n_ff,
        "n_ctx_train": n_ctx_train, "head_dim": head_dim or n_embd // n_head, "sliding_window": sliding_window,
        "swa_pattern": list(swa_pattern) if swa_pattern is not None else None, "vocab": vocab.name,
        "version": _GENERATOR_VERSION,
    }
    target = Path(path) if path is not None else tiny_model_dir()
    if target.suffix != ".gguf":
        digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
        target.mkdir(parents=True, exist_ok=True)
        target = target / f"tiny-{arch}-{digest}.gguf"
        if target.exists():
            return target
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    _write(partial, params, vocab)
    partial.replace(target)
    return target
