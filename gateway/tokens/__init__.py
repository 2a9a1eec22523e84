"""Token counting: exact where the backend's tokenizer is known, an estimate flagged as such everywhere else.

Public entry points (see each module):
    count_prompt(prompt, counter) -> TokenCount                     request_count.py
    build_counter_chain(kind, model, client=, settings=)            factory.py
    CounterChain, Counter, TokenCount, CounterUnavailable           chain.py, count.py
    tokenizer_from_gguf_metadata, load_gguf_tokenizer,
    read_gguf_tokenizer_metadata, UnsupportedTokenizer              gguf_vocab.py
"""

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
