"""Each runtime's answers, per kind: the one table of what Ollama, llama-server and an OpenAI-compatible server do
differently (gateway/runtimes/). Pure: no server, no I/O; the matrix prints with ``-s``."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from gateway import dialects
from gateway.backends.runtime_port import BackendRuntime
from gateway.domain import BackendKind, Dialect, Operation
from gateway.runtimes import PoolSource, Runtime, runtime_for

OLLAMA, LLAMA, OPENAI = BackendKind.OLLAMA, BackendKind.LLAMA_SERVER, BackendKind.OPENAI
KINDS = (OLLAMA, LLAMA, OPENAI)

V1_CHAT = dialects.parse(Dialect.OPENAI, Operation.CHAT, {"model": "m", "messages": []}, "/v1/chat/completions")
NATIVE_CHAT = dialects.parse(Dialect.OLLAMA, Operation.CHAT,
                             {"model": "m", "messages": [], "options": {"num_ctx": 4096}}, "/api/chat")

QUESTIONS: dict[str, Any] = {
    "list_path": lambda r: r.list_path,
    "serves_one_model": lambda r: r.serves_one_model,
    "needs_listed_model": lambda r: r.needs_listed_model,
    "pool_source": lambda r: str(r.pool_source),
    "pool_model('qwen')": lambda r: r.pool_model("qwen"),
    "probe_loads_model": lambda r: r.probe_loads_model,
    "lists_loaded_models": lambda r: r.lists_loaded_models,
    "reloads_on_num_ctx": lambda r: r.reloads_on_num_ctx,
    "runs_at_default_context(/v1 chat)": lambda r: r.runs_at_default_context(V1_CHAT),
    "runs_at_default_context(num_ctx sent)": lambda r: r.runs_at_default_context(NATIVE_CHAT),
    "cuts_silently": lambda r: r.cuts_silently,
    "completions_run(n=3)": lambda r: r.completions_run(3),
    "ignored_n_note(n=3)": lambda r: bool(r.ignored_n_note(3)),
    "reserves_kv(embed)": lambda r: r.reserves_kv(Operation.EMBED),
    "reserves_kv(chat)": lambda r: r.reserves_kv(Operation.CHAT),
    "reads_server_template": lambda r: r.reads_server_template,
    "calibrates_estimates": lambda r: r.calibrates_estimates,
    "gates_loads": lambda r: r.gates_loads,
    "empty_request_loads": lambda r: r.empty_request_loads,
}

EXPECTED: dict[str, tuple[Any, Any, Any]] = {  # ollama, llama-server, openai
    "list_path": ("/api/tags", "/v1/models", "/v1/models"),
    "serves_one_model": (False, True, False),
    "needs_listed_model": (True, False, False),
    "pool_source": ("loaded_model", "server_props", "configured"),
    "pool_model('qwen')": ("qwen", "", ""),
    "probe_loads_model": (True, False, False),
    "lists_loaded_models": (True, False, False),
    "reloads_on_num_ctx": (True, False, False),
    "runs_at_default_context(/v1 chat)": (True, False, False),
    "runs_at_default_context(num_ctx sent)": (False, False, False),
    "cuts_silently": (True, False, False),
    "completions_run(n=3)": (1, 3, 3),
    "ignored_n_note(n=3)": (True, False, False),
    "reserves_kv(embed)": (False, True, True),
    "reserves_kv(chat)": (True, True, True),
    "reads_server_template": (False, True, False),
    "calibrates_estimates": (True, False, False),
    "gates_loads": (True, False, False),
    "empty_request_loads": (True, False, False),
}


def test_the_matrix_of_answers_question_by_kind() -> None:
    width = max(map(len, QUESTIONS))
    print(f"\n  {'question':<{width}}  " + "  ".join(f"{kind:<14}" for kind in KINDS))
    for question, ask in QUESTIONS.items():
        answers = tuple(ask(runtime_for(kind)) for kind in KINDS)
        print(f"  {question:<{width}}  " + "  ".join(f"{answer!s:<14}" for answer in answers))
        assert answers == EXPECTED[question], question
    assert set(QUESTIONS) == set(EXPECTED)


@pytest.mark.parametrize("kind", KINDS)
def test_one_runtime_per_kind_knows_its_kind(kind: BackendKind) -> None:
    runtime = runtime_for(kind)
    assert runtime.kind is kind
    assert runtime_for(kind) is runtime  # stateless: one, shared
    assert isinstance(runtime, Runtime)


@pytest.mark.parametrize("kind", KINDS)
def test_every_runtime_answers_what_the_packages_below_ask(kind: BackendKind) -> None:
    """The registry, the counters and the load gate hold a runtime through backends/runtime_port.py."""
    port: BackendRuntime = runtime_for(kind)
    assert port.kind is kind


def test_the_llama_server_pool_is_the_servers_whatever_model_is_named() -> None:
    assert {runtime_for(LLAMA).pool_model(name) for name in ("a", "", None)} == {""}
    assert runtime_for(OLLAMA).pool_model(None) == ""
    assert runtime_for(LLAMA).pool_source is PoolSource.SERVER_PROPS


def test_ollamas_note_names_the_n_it_ignores() -> None:
    (note,) = runtime_for(OLLAMA).ignored_n_note(4)
    assert note.startswith("n=4 forwarded unchanged; Ollama runs one sequence")
    assert runtime_for(OLLAMA).ignored_n_note(1) == ()


def test_importing_the_runtimes_loads_no_io() -> None:
    """The pure planner asks a runtime, so the runtimes load no aiohttp or asyncio (runtime.py's docstring)."""
    import subprocess

    code = "import sys, gateway.runtimes; print(sorted({'aiohttp', 'asyncio', 'redis'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_backend_is_asked_through_the_runtime_it_carries() -> None:
    from typing import cast

    from gateway.backends import Backend, BackendClient
    from gateway.config.settings import BackendSettings
    from gateway.runtimes.ollama import OllamaRuntime

    class Pinned(OllamaRuntime):  # a test's own runtime, wired into one backend
        reloads_on_num_ctx = False

    config = BackendSettings(name="o", url="http://127.0.0.1:9")
    carried = Backend(config, cast(BackendClient, None), runtime=Pinned())
    plain = Backend(config, cast(BackendClient, None), runtime=runtime_for(config.kind))
    assert runtime_for(carried) is carried.runtime and not runtime_for(carried).reloads_on_num_ctx
    assert runtime_for(plain) is runtime_for(OLLAMA)
