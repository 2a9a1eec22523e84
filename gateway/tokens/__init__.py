"""Token counting: exact where the backend's tokenizer is known, an estimate flagged as such everywhere else.

Public entry points (see each module):
    count_prompt(prompt, counter) -> TokenCount                     request_count.py
    build_counter_chain(model, settings=, served=, read_tokenizer=) factory.py
    CounterChain, Counter, TokenCount, CounterUnavailable           chain.py, count.py
    tokenizer_from_gguf_metadata, load_gguf_tokenizer,
    read_gguf_tokenizer_metadata, UnsupportedTokenizer              gguf_vocab.py
"""

from typing import TYPE_CHECKING

from gateway.support.lazy import export

if TYPE_CHECKING:  # at run time each name is imported on first use (gateway/support/lazy.py)
    from gateway.tokens.chain import CounterChain
    from gateway.tokens.count import Calibrating, Counter, CounterUnavailable, TokenCount
    from gateway.tokens.factory import CountingSettings, build_counter_chain
    from gateway.tokens.gguf_vocab import (
        UnsupportedTokenizer,
        load_gguf_tokenizer,
        read_gguf_tokenizer_metadata,
        tokenizer_from_gguf_metadata,
    )
    from gateway.tokens.request_count import count_prompt

_EXPORTS = {
    "Calibrating": "gateway.tokens.count",
    "Counter": "gateway.tokens.count",
    "CounterChain": "gateway.tokens.chain",
    "CounterUnavailable": "gateway.tokens.count",
    "CountingSettings": "gateway.tokens.factory",
    "TokenCount": "gateway.tokens.count",
    "UnsupportedTokenizer": "gateway.tokens.gguf_vocab",
    "build_counter_chain": "gateway.tokens.factory",
    "count_prompt": "gateway.tokens.request_count",
    "load_gguf_tokenizer": "gateway.tokens.gguf_vocab",
    "read_gguf_tokenizer_metadata": "gateway.tokens.gguf_vocab",
    "tokenizer_from_gguf_metadata": "gateway.tokens.gguf_vocab",
}


def __getattr__(name: str) -> object:
    return export(__name__, _EXPORTS, name)


__all__ = [
    "Calibrating",
    "Counter",
    "CounterChain",
    "CounterUnavailable",
    "CountingSettings",
    "TokenCount",
    "UnsupportedTokenizer",
    "build_counter_chain",
    "count_prompt",
    "load_gguf_tokenizer",
    "read_gguf_tokenizer_metadata",
    "tokenizer_from_gguf_metadata",
]
