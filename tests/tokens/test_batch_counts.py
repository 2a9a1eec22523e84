"""Batches, embeddings and reranks: each prompt parsed and counted on its own (one sequence each on llama-server).

The shapes follow llama-server's ``tokenize_input_prompts`` (checked against the real server, see
tests/e2e/test_batches_llama_server.py): an array with no token id in it is a batch, anything else one prompt.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway import dialects
from gateway.domain import Dialect, Operation
from gateway.errors import InvalidField
from gateway.tokens.request_count import count_prompt, prompt_bytes
from tests.tokens.test_request_count import RecordingCounter

# (prompt, per-prompt counts with one token per character plus the BOS a counter adds to a text)
BATCHES = [
    pytest.param("abc", (), 4, id="string"),
    pytest.param([1, 2, 3], (), 3, id="token-ids"),
    pytest.param(["ab", 7, "c"], (), 3 + 1 + 1, id="mixed-is-one-prompt"),
    pytest.param(["ab"], (3,), 3, id="single-element-batch"),
    pytest.param(["ab", "cde"], (3, 4), 7, id="strings"),
    pytest.param([[1, 2], [3]], (2, 1), 3, id="token-id-lists"),
    pytest.param([[1, 2], "xy", ["a", 5]], (2, 3, 3), 8, id="mixed-batch"),
    pytest.param([{"prompt_string": "xyz"}, "a"], (4, 2), 6, id="multimodal-object-in-a-batch"),
    pytest.param([[]], (0,), 0, id="an-empty-token-list"),
]


@pytest.mark.parametrize(("prompt", "per_prompt", "tokens"), BATCHES)
@pytest.mark.parametrize("dialect", [Dialect.LLAMACPP, Dialect.OPENAI])
async def test_every_prompt_is_counted_on_its_own(
    dialect: Dialect, prompt: Any, per_prompt: tuple[int, ...], tokens: int
) -> None:
    if dialect is Dialect.OPENAI and isinstance(prompt, list) and any(isinstance(p, dict) for p in prompt):
        pytest.skip("llama-server's own extension")
    parsed = dialects.parse(dialect, Operation.GENERATE, {"prompt": prompt}, "")
    counted = await count_prompt(parsed.prompt_input, RecordingCounter())
    assert (counted.per_prompt, counted.tokens) == (per_prompt, tokens)
    assert len(parsed.prompt_input.batch) == len(per_prompt)


GARBAGE = [
    pytest.param([], "field 'prompt' must not be empty", id="empty-batch"),
    pytest.param([["a"]], "field 'prompt[0]' must be a string, a list of token ids", id="nested-strings"),
    pytest.param(["a", [["b"]]], "field 'prompt[1]'", id="nested-deeper"),
    pytest.param([True], "field 'prompt[0]'", id="boolean"),
    pytest.param(["a", 1.5], "field 'prompt[1]'", id="float"),
    pytest.param([1, [2]], "field 'prompt' must be a string, an array of token ids", id="ids-and-a-list"),
    pytest.param(["a", {"x": 1}], "field 'prompt[1]'", id="object-without-prompt-string"),
]


@pytest.mark.parametrize(("prompt", "message"), GARBAGE)
def test_llama_server_routes_refuse_what_the_server_refuses(prompt: Any, message: str) -> None:
    with pytest.raises(InvalidField, match=message.replace("[", r"\[").replace("]", r"\]")):
        dialects.parse(Dialect.LLAMACPP, Operation.GENERATE, {"prompt": prompt}, "")


@pytest.mark.parametrize(("prompt", "tokens"), [([], 0), ([["a"]], 2), ([True], 0)])
async def test_the_openai_routes_leave_odd_shapes_to_the_backend(prompt: Any, tokens: int) -> None:
    """/v1/completions reaches Ollama, vLLM and llama-server, each with its own rules: kvgate counts what it can read
    (the text of a list of strings, here) and the backend answers its own 400 for the rest."""
    parsed = dialects.parse(Dialect.OPENAI, Operation.GENERATE, {"prompt": prompt}, "/v1/completions")
    counted = await count_prompt(parsed.prompt_input, RecordingCounter())
    assert counted.tokens == tokens


EMBEDDINGS = [
    pytest.param(Dialect.LLAMACPP, {"content": "hello"}, (6,), id="native-content"),
    pytest.param(Dialect.LLAMACPP, {"input": ["a", "bc"], "content": "ignored"}, (2, 3), id="native-input-first"),
    pytest.param(Dialect.LLAMACPP, {"content": [[1, 2, 3], "x"]}, (3, 2), id="native-token-ids"),
    pytest.param(Dialect.OPENAI, {"input": "hello"}, (6,), id="openai-one"),
    pytest.param(Dialect.OPENAI, {"input": ["a", "bc", "def"]}, (2, 3, 4), id="openai-many"),
    pytest.param(Dialect.OLLAMA, {"model": "m", "input": ["a", "bc"]}, (2, 3), id="ollama-embed"),
    pytest.param(Dialect.OLLAMA, {"model": "m", "prompt": "abc"}, (4,), id="ollama-legacy-embeddings"),
]


@pytest.mark.parametrize(("dialect", "body", "per_prompt"), EMBEDDINGS)
async def test_each_embedding_input_is_a_sequence(dialect: Dialect, body: dict[str, Any],
                                                  per_prompt: tuple[int, ...]) -> None:
    parsed = dialects.parse(dialect, Operation.EMBED, body, "")
    assert parsed.allocates_kv and parsed.output.tokens is None
    counted = await count_prompt(parsed.prompt_input, RecordingCounter())
    assert counted.per_prompt == per_prompt


async def test_a_rerank_is_one_estimated_pair_per_document() -> None:
    parsed = dialects.parse(Dialect.LLAMACPP, Operation.RERANK, {"query": "qq", "documents": ["a", "bcd"]}, "")
    counter = RecordingCounter()
    counted = await count_prompt(parsed.prompt_input, counter)
    # query and document each with a BOS, plus the separators llama-server adds (BOS q EOS SEP d EOS at most)
    assert counted.per_prompt == (3 + 2 + 2, 3 + 4 + 2) and not counted.exact
    assert counter.texts == [("qq", True), ("a", True), ("qq", True), ("bcd", True)]
    assert prompt_bytes(parsed.prompt_input) == 2 * 2 + 1 + 3


@pytest.mark.parametrize(("body", "message"), [
    ({"documents": ["a"]}, "field 'query' is required"),
    ({"query": 3, "documents": ["a"]}, "field 'query' is required and must be a string"),
    ({"query": "q", "documents": []}, "field 'documents' must be a non-empty array of strings"),
    ({"query": "q", "documents": ["a", 2]}, "field 'documents' must be"),
    ({"query": "q", "texts": "a"}, "field 'texts' must be"),
])
def test_a_rerank_without_a_query_or_documents_is_refused(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidField, match=message):
        dialects.parse(Dialect.LLAMACPP, Operation.RERANK, body, "")


def test_an_embedding_without_input_is_refused_on_llama_server_routes() -> None:
    with pytest.raises(InvalidField, match=r"field 'input' \(or 'content'\) is required"):
        dialects.parse(Dialect.LLAMACPP, Operation.EMBED, {"model": "m"}, "")
    with pytest.raises(InvalidField, match="field 'input' must not be empty"):
        dialects.parse(Dialect.LLAMACPP, Operation.EMBED, {"input": []}, "")
