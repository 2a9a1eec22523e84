"""What each kind of backend runs for a request (sequence_rules), and the cost ``admit`` builds from it."""

from __future__ import annotations

import pytest

from gateway import dialects
from gateway.admission import PoolSpec
from gateway.admission.admit import request_cost
from gateway.admission.sequence_rules import RULES, completions_run, ignored_n_note, reserves_kv
from gateway.admission.tenant_keys import Tenant
from gateway.domain import BackendKind, Dialect, Operation
from gateway.errors import InvalidField
from gateway.tokens import TokenCount

OLLAMA = PoolSpec.split_pool("o", "llama3.1:8b", BackendKind.OLLAMA, slot_ctx_tokens=8192, slots=2)
LLAMA = PoolSpec.unified_pool("cpp", "tiny", pool_tokens=8192, slots=4)
OPENAI = PoolSpec.split_pool("vllm", "", BackendKind.OPENAI, slot_ctx_tokens=8192, slots=8)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}


@pytest.mark.parametrize(("kind", "asked", "runs"), [
    (BackendKind.OLLAMA, 1, 1), (BackendKind.OLLAMA, 2, 1), (BackendKind.OLLAMA, 8, 1),
    (BackendKind.LLAMA_SERVER, 1, 1), (BackendKind.LLAMA_SERVER, 3, 3),
    (BackendKind.OPENAI, 4, 4),
])
def test_n_is_run_only_where_the_backend_honours_it(kind: BackendKind, asked: int, runs: int) -> None:
    assert completions_run(kind, asked) == runs
    assert bool(ignored_n_note(kind, asked)) == (runs < asked)


@pytest.mark.parametrize(("kind", "operation", "reserves"), [
    (BackendKind.OLLAMA, Operation.CHAT, True), (BackendKind.OLLAMA, Operation.EMBED, False),
    (BackendKind.LLAMA_SERVER, Operation.EMBED, True), (BackendKind.LLAMA_SERVER, Operation.RERANK, True),
    (BackendKind.OPENAI, Operation.EMBED, True), (BackendKind.OPENAI, Operation.GENERATE, True),
])
def test_which_requests_reserve_kv(kind: BackendKind, operation: Operation, reserves: bool) -> None:
    assert reserves_kv(kind, operation) is reserves


def test_every_backend_kind_has_a_rule() -> None:
    assert set(RULES) == set(BackendKind)


@pytest.mark.parametrize(("pool", "sequences"), [(OLLAMA, 1), (LLAMA, 2), (OPENAI, 2)])
def test_the_cost_of_n_2_follows_the_backend(pool: PoolSpec, sequences: int) -> None:
    parsed = dialects.parse(Dialect.OPENAI, Operation.CHAT, {**CHAT, "n": 2}, "/v1/chat/completions")
    cost = request_cost(parsed, pool, TokenCount(10, "x", True), Tenant("t"), 100)
    assert cost.sequences == sequences and parsed.body["n"] == 2  # the body is forwarded as sent


def test_a_batch_costs_each_prompt_and_an_embedding_no_output() -> None:
    batch = dialects.parse(Dialect.LLAMACPP, Operation.GENERATE, {"prompt": ["a", "b c"], "n_predict": 9}, "")
    cost = request_cost(batch, LLAMA, TokenCount(5, "x", True, per_prompt=(2, 3)), Tenant("t"), 9)
    assert (cost.batch_prompt_tokens, cost.max_output_tokens) == ((2, 3), 9)
    embed = dialects.parse(Dialect.OPENAI, Operation.EMBED, {"input": "a"}, "/v1/embeddings")
    cost = request_cost(embed, LLAMA, TokenCount(2, "x", True, per_prompt=(2,)), Tenant("t"), None)
    assert (cost.batch_prompt_tokens, cost.max_output_tokens, cost.prompt_tokens) == ((), 0, 2)


@pytest.mark.parametrize(("n", "lenient"), [(None, 1), (2, 2), (2.0, 2), (0, 1), (-3, 1), ("2", 1), (True, 1)])
def test_n_on_the_openai_routes_is_left_to_the_backend(n: object, lenient: int) -> None:
    """/v1 routes reach Ollama (which ignores ``n``) as well as servers that answer their own 400 for a bad one:
    kvgate reserves what a valid ``n`` runs and refuses nothing; llama-server's own routes refuse what it refuses."""
    body = {**CHAT, "n": n}
    assert dialects.parse(Dialect.OPENAI, Operation.CHAT, body, "/v1/chat/completions").sequences == lenient
    if n in (0, -3):
        with pytest.raises(InvalidField, match="field 'n' must be at least 1"):
            dialects.parse(Dialect.LLAMACPP, Operation.GENERATE, {"prompt": "x", "n": n}, "/completion")
