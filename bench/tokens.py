"""Token counting speed, side by side in one run (medians): kvgate's counter vs tiktoken vs a naive recount.

    python -m bench.tokens [--target-tokens 131072] [--repeats 7] [--tiktoken-dir DIR]

Rows, all on the Llama 3 vocabulary (ggml-vocab-llama-bpe.gguf) and the Llama 3.1 chat template:
  convert          GGUF -> tokenizer.json (first run) and loading it back from the disk cache
  cold             kvgate count_chat of a ~128K-token conversation with an empty message cache
  warm             the same conversation plus one new message (only the new message is tokenized)
  small/s          distinct 3-message chats counted per second
  tiktoken         tiktoken on the same rendered text: cl100k_base/o200k_base when their files are in
                   --tiktoken-dir (no network here), else the Llama 3 ranks loaded into tiktoken (same vocabulary)
  naive            one Tokenizer.encode of the whole rendered prompt, no cache, no batching
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import tiktoken

from gateway.support.gguf_reader import read_gguf_metadata
from gateway.tokens.count import CounterUnavailable
from gateway.tokens.gguf_vocab import load_gguf_tokenizer
from gateway.tokens.sources import GGUFFileSource
from gateway.tokens.templates import render
from gateway.tokens.tiktoken_counter import ENCODINGS, load_encoding
from gateway.tokens.tokenizer_counter import TokenizerCounter

VOCAB = Path(__file__).resolve().parents[1] / "gateway" / "data" / "vocab" / "ggml-vocab-llama-bpe.gguf"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_VOCABULARY = (
    "the of and to in a is that for it as was with be by on not he I this are or his from at which but have an they "
    "you were her she there would their we him been has when who will more no if out so said what up its about into "
    "than them can only other new some could time these two may then do first any my now such like our over man me "
    "even most made after also did many before must through back years where much your way well down should because "
    "KV-cache tokens llama-server Ollama gateway 128K context 2048 slots numbers 3.14159 2026 café naïve 東京 😀"
)
WORDS = _VOCABULARY.split()
CODE = 'def handler(request):\n    body = await request.json()\n    return {"ok": True, "n": len(body)}\n\n'


def _message(rng: random.Random, n_words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(n_words))
    return text + ("\n\n" + CODE if rng.random() < 0.2 else "")


def conversation(target_tokens: int, seed: int = 1) -> list[dict[str, Any]]:
    """A system prompt and alternating turns of ~300-token messages, about `target_tokens` long."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant. " * 10}]
    words = 0
    while words < target_tokens * 0.84:  # about 1.2 tokens per word with this mix (plus template tokens)
        n = rng.randint(120, 420)
        role = "user" if len(messages) % 2 else "assistant"
        messages.append({"role": role, "content": _message(rng, n)})
        words += n
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": "Thanks, continue."})
    return messages


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _time_sync(fn: Callable[[], object], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


async def _time_async(make: Callable[[int], Awaitable[object]], repeats: int) -> list[float]:
    samples = []
    for i in range(repeats):
        start = time.perf_counter()
        await make(i)
        samples.append(time.perf_counter() - start)
    return samples


def llama3_tiktoken() -> tiktoken.Encoding:
    """The Llama 3 vocabulary as a tiktoken Encoding (Llama 3's tokenizer is tiktoken-based; ids are ranks)."""
    meta = read_gguf_metadata(VOCAB).values
    byte_of = {ch: b for b, ch in _bytes_to_unicode().items()}
    ranks = {}
    for rank, (token, kind) in enumerate(
        zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], strict=True)
    ):
        if kind == 1:
            ranks[bytes(byte_of[ch] for ch in token)] = rank
    specials = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"]) if i >= 128000}
    return tiktoken.Encoding("llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def _bytes_to_unicode() -> dict[int, str]:
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    mapping = {b: chr(b) for b in visible}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def pick_tiktoken(directory: Path | None) -> tuple[str, tiktoken.Encoding]:
    if directory is not None:
        for name in ("o200k_base", "cl100k_base"):
            try:
                return name, load_encoding(name, directory)
            except CounterUnavailable as exc:
                print(f"note: {name} unavailable offline ({exc.reason})")
    else:
        print(f"note: no --tiktoken-dir: {', '.join(ENCODINGS)} are not available offline (no network)")
    return "llama3 ranks in tiktoken", llama3_tiktoken()


async def run(target_tokens: int, repeats: int, tiktoken_dir: Path | None) -> None:
    cache_dir = Path(tempfile.mkdtemp(prefix="kvgate-bench-"))
    build_s = _time_sync(lambda: load_gguf_tokenizer(VOCAB, cache_dir=cache_dir), 1)[0]
    load_s = _time_sync(lambda: load_gguf_tokenizer(VOCAB, cache_dir=cache_dir), 3)
    today = dt.date.today()
    chat = conversation(target_tokens)
    source = GGUFFileSource(VOCAB, cache_dir=cache_dir)

    def fresh() -> TokenizerCounter:
        return TokenizerCounter(source, model="llama3", template="llama3.1", today=lambda: today)

    warm = fresh()
    total = (await warm.count_chat(chat)).tokens
    engine = await warm.engine()
    tokenizer = engine.tokenizer

    cold_counters = [fresh() for _ in range(repeats)]
    for counter in cold_counters:
        await counter.engine()  # loading the tokenizer is not part of a count
    cold = await _time_async(lambda i: cold_counters[i].count_chat(chat), repeats)
    rng = random.Random(7)
    extra = [_message(rng, 60) for _ in range(repeats)]
    warm_s = await _time_async(lambda i: warm.count_chat([*chat, {"role": "user", "content": extra[i]}]), repeats)

    small = [
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": _message(rng, 30)},
            {"role": "assistant", "content": _message(rng, 20)},
        ]
        for _ in range(2000)
    ]
    start = time.perf_counter()
    for item in small:
        await warm.count_chat(item)
    small_per_s = len(small) / (time.perf_counter() - start)

    prompt = "".join(render("llama3.1", chat, today=today))
    name, encoding = pick_tiktoken(tiktoken_dir)
    tik = _time_sync(lambda: encoding.encode(prompt, allowed_special="all"), repeats)
    tik_tokens = len(encoding.encode(prompt, allowed_special="all"))
    naive = _time_sync(lambda: tokenizer.encode(prompt), repeats)
    naive_tokens = len(tokenizer.encode(prompt).ids)

    cores = os.cpu_count()
    print(f"\nconversation: {len(chat)} messages, {total} tokens (naive recount {naive_tokens}); {cores} cores")
    print(f"{'measurement':44s} {'median':>12s} {'vs naive':>9s}")
    rows = [
        ("convert GGUF -> tokenizer.json (once)", build_s * 1000, None),
        ("load converted tokenizer from disk cache", _median_ms(load_s), None),
        ("kvgate cold count (empty message cache)", _median_ms(cold), _median_ms(naive) / _median_ms(cold)),
        ("kvgate warm count (+1 message)", _median_ms(warm_s), _median_ms(naive) / _median_ms(warm_s)),
        (f"tiktoken encode ({name}, {tik_tokens} tok)", _median_ms(tik), _median_ms(naive) / _median_ms(tik)),
        ("naive full recount (Tokenizer.encode)", _median_ms(naive), 1.0),
    ]
    for label, ms, ratio in rows:
        print(f"{label:44s} {ms:10.2f} ms {'' if ratio is None else f'{ratio:8.1f}x'}")
    print(f"{'kvgate small chats (3 messages) per second':44s} {small_per_s:10.0f} /s")
    print("targets (2 cores): warm <= 2 ms, cold 128K <= 150 ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-tokens", type=int, default=131072)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tiktoken-dir", type=Path, default=None, help="directory with cl100k/o200k files")
    args = parser.parse_args()
    asyncio.run(run(args.target_tokens, args.repeats, args.tiktoken_dir))


if __name__ == "__main__":
    main()
