"""The counters and the chain, against real loopback fakes of llama-server and Ollama (no mocks)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.backends.client import BackendClient
from gateway.domain import BackendKind
from gateway.runtimes import runtime_for
from gateway.tokens.byte_estimate import EstimateCounter
from gateway.tokens.chain import CounterChain
from gateway.tokens.count import Counter, CounterUnavailable, TokenCount
from gateway.tokens.gguf_vocab import read_gguf_tokenizer_metadata
from gateway.tokens.llama_server_counter import LlamaServerCounter
from gateway.tokens.overhead import OverheadEstimator
from gateway.tokens.sources import GGUFFileSource, OllamaShowSource, TokenizerJsonSource
from gateway.tokens.tiktoken_counter import EncodingSpec, TiktokenCounter
from gateway.tokens.tokenizer_counter import TokenizerCounter
from tests.support.fake_backend import FakeLLM, OllamaModels, running, serve
from tests.tokens.vocab_vectors import SESSION_CACHE_DIR, shared_tokenizer, vocab_path

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there, how are you?"}]


def _json_meta(vocab: str) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(read_gguf_tokenizer_metadata(vocab_path(vocab))))
    return loaded


def _gguf(vocab: str) -> GGUFFileSource:
    """A GGUF source sharing this run's tokenizer cache: each vocabulary is converted once per run."""
    return GGUFFileSource(vocab_path(vocab), cache_dir=SESSION_CACHE_DIR)


def _ollama(model: str, digest: str, model_info: dict[str, Any]) -> FakeLLM:
    """A fake Ollama with one model whose /api/show model_info is ``model_info``."""
    return FakeLLM(answers=OllamaModels({model: (model_info, digest)}).answers())


# ---- llama-server counter ------------------------------------------------------------------------------------


async def test_llama_server_counter_reads_both_routes() -> None:
    seen: list[dict[str, Any]] = []

    async def input_tokens(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response({"input_tokens": 45, "object": "response.input_tokens"})

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        return web.json_response({"tokens": list(range(len(body["content"].split()) + int(body["add_special"])))})

    routes = {("POST", "/v1/chat/completions/input_tokens"): input_tokens, ("POST", "/tokenize"): tokenize}
    async with serve(routes) as url, aiohttp.ClientSession() as session:
        counter = LlamaServerCounter(BackendClient(session, url, api_key="secret"), model="m")
        assert await counter.count_chat(CHAT, [{"type": "function", "function": {"name": "f"}}]) == TokenCount(
            45, "llama-server", True
        )
        assert (await counter.count_text("a b c")).tokens == 4
        assert (await counter.count_text("a b c", add_special=False)).tokens == 3
    assert seen[0]["model"] == "m" and seen[0]["tools"][0]["function"]["name"] == "f"
    assert seen[1]["parse_special"] is True
    assert "secret" not in repr(counter)


async def test_llama_server_counter_unavailable_on_error_status_and_refused_connection() -> None:
    async def loading(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": 503, "message": "Loading model"}}, status=503)

    async with serve({("POST", "/v1/chat/completions/input_tokens"): loading}) as url, aiohttp.ClientSession() as s:
        with pytest.raises(CounterUnavailable, match="HTTP 503"):
            await LlamaServerCounter(BackendClient(s, url)).count_chat(CHAT)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(CounterUnavailable, match="llama-server"):
            gone = LlamaServerCounter(BackendClient(session, url), timeout_s=0.5)
            await gone.count_chat(CHAT)  # the server is gone now


async def test_llama_server_counter_counts_invalid_utf8_by_bytes() -> None:
    async with aiohttp.ClientSession() as session:
        counted = await LlamaServerCounter(BackendClient(session, "http://127.0.0.1:9")).count_text(b"\xff\xfe abc")
    assert counted == TokenCount(6, "llama-server/bytes", exact=False)


# ---- GGUF / tokenizer.json counters ------------------------------------------------------------------------------


async def test_gguf_counter_template_mode_is_exact() -> None:
    counter = TokenizerCounter(_gguf("llama-bpe"), model="llama3", template="llama3")
    counted = await counter.count_chat(CHAT)
    # BOS + per message: header (4 tokens) + content + <|eot_id|>; then the generation header (4)
    assert counted.exact and counted.counter == "gguf"
    assert counted.tokens == 1 + (4 + 3 + 1) + (4 + 7 + 1) + 4


async def test_gguf_counter_content_mode_learns_overhead() -> None:
    overhead = OverheadEstimator(default_per_message_tokens=10, default_per_request_tokens=64)
    counter = TokenizerCounter(_gguf("llama-bpe"), model="m", overhead=overhead)
    content = await counter.content_tokens(CHAT)
    first = await counter.count_chat(CHAT)
    assert first == TokenCount(content + 1 + 2 * 10 + 64, "gguf", exact=False, content_tokens=content)
    # The backend really uses 5 per message and 3 per request (BOS counted in content).
    longer = [*CHAT, {"role": "assistant", "content": "Fine."}, {"role": "user", "content": "Good."}]
    for chat in (CHAT, longer, CHAT[1:], longer):
        observed = await counter.content_tokens(chat) + 1 + 5 * len(chat) + 3
        await counter.calibrate(chat, [], observed)
    learned = await counter.count_chat(longer)
    assert learned.tokens == await counter.content_tokens(longer) + 1 + 5 * 4 + 3
    assert learned.exact


async def test_content_mode_counts_tools_images_and_tool_calls() -> None:
    counter = TokenizerCounter(_gguf("gpt-2"), model="m", image_tokens=768)
    plain = await counter.content_tokens([{"role": "user", "content": "hi"}])
    with_image = await counter.content_tokens([{"role": "user", "content": "hi", "images": ["aGk="]}])
    assert with_image - plain == 768
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    assert await counter.content_tokens([{"role": "user", "content": "hi"}], [tool]) > plain
    call = {"role": "assistant", "tool_calls": [{"function": {"name": "lookup", "arguments": {"q": "x"}}}]}
    assert await counter.content_tokens([call]) > 0


async def test_invalid_utf8_text_is_counted_by_bytes_not_raised() -> None:
    counter = TokenizerCounter(_gguf("gpt-2"), model="m")
    assert await counter.count_text(b"ok \xc3\x28 broken") == TokenCount(12, "gguf/bytes", exact=False)
    assert (await counter.count_text("lone \ud800 surrogate")).exact is False
    assert (await counter.count_chat([{"role": "user", "content": "x \udfff y"}])).tokens > 0


async def test_message_cache_makes_next_turn_count_only_new_messages() -> None:
    counter = TokenizerCounter(_gguf("llama-bpe"), model="m", template="llama3")
    engine = await counter.engine()
    chat = [{"role": "user", "content": f"message number {i}"} for i in range(20)]
    await counter.count_chat(chat)
    misses = engine.cache.misses
    await counter.count_chat([*chat, {"role": "user", "content": "one more"}])
    # the system header, the generation prompt and the 20 old messages hit; only the new message misses
    assert engine.cache.misses - misses == 1


async def test_corrupt_gguf_is_permanently_unavailable(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(vocab_path("gpt-2").read_bytes()[:4096])
    counter = TokenizerCounter(GGUFFileSource(broken), model="broken-model")
    for _ in range(2):
        with pytest.raises(CounterUnavailable, match="broken-model"):
            await counter.count_text("hello")


async def test_tokenizer_json_source(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    shared_tokenizer("qwen2").save(str(path))
    counter = TokenizerCounter(TokenizerJsonSource(path), model="qwen", template="chatml")
    assert (await counter.count_text("Hello world")).tokens == 2
    missing = TokenizerCounter(TokenizerJsonSource(tmp_path / "nope.json"), model="qwen")
    with pytest.raises(CounterUnavailable, match=r"nope\.json"):
        await missing.count_text("x")


# ---- Ollama source ------------------------------------------------------------------------------------------------


async def test_ollama_source_builds_once_and_caches_by_digest(tmp_path: Path) -> None:
    fake = _ollama("llama2:latest", "sha256:abc123", _json_meta("llama-spm"))
    async with running(fake), aiohttp.ClientSession() as session:
        url = fake.url
        for _ in range(2):  # two gateway processes: the second finds the converted tokenizer on disk
            source = OllamaShowSource(BackendClient(session, url), "llama2", cache_dir=tmp_path)
            counter = TokenizerCounter(source, model="llama2")
            assert (await counter.count_text("Hello world", add_special=False)).tokens == 2
    assert sum(bool(body.get("verbose")) for body in fake.json_bodies("/api/show")) == 1  # the second only asks
    assert len(fake.requests_to("/api/show")) == 2  # for the (small) template
    assert len(fake.requests_to("/api/tags")) == 2
    assert (tmp_path / "ollama-sha256-abc123.v1.tokenizer.json").is_file()


async def test_unsupported_ollama_tokenizer_falls_back_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    info = {**_json_meta("gpt-2"), "tokenizer.ggml.model": "bert"}
    fake = _ollama("embed:latest", "sha256:def", info)
    async with running(fake), aiohttp.ClientSession() as session:
        source = OllamaShowSource(BackendClient(session, fake.url), "embed:latest")
        gguf = TokenizerCounter(source, model="embed:latest")
        chain = CounterChain("embed:latest", [gguf, EstimateCounter()])
        with caplog.at_level(logging.WARNING, logger="gateway.tokens.chain"):
            first = await chain.count_chat(CHAT)
            second = await chain.count_chat(CHAT)
    assert first.counter == second.counter == "estimate" and not first.exact
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "embed:latest" in warnings[0] and "'bert'" in warnings[0] and "estimate" in warnings[0]
    assert len(fake.requests_to("/api/show")) == 1  # a permanent failure is not retried per request


async def test_ollama_unknown_model_is_unavailable() -> None:
    fake = _ollama("llama2:latest", "sha256:abc", _json_meta("llama-spm"))
    async with running(fake), aiohttp.ClientSession() as session:
        counter = TokenizerCounter(OllamaShowSource(BackendClient(session, fake.url), "nope"), model="nope")
        with pytest.raises(CounterUnavailable, match="HTTP 404"):
            await counter.count_text("x")


# ---- tiktoken, estimate, chain ----------------------------------------------------------------------------------


async def test_tiktoken_without_the_file_is_unavailable_with_where_it_looked(tmp_path: Path) -> None:
    counter = TiktokenCounter("o200k_base", tmp_path)
    with pytest.raises(CounterUnavailable, match=r"not found offline.*o200k_base\.tiktoken"):
        await counter.count_text("hello")


async def test_tiktoken_rejects_a_file_with_the_wrong_hash(tmp_path: Path) -> None:
    (tmp_path / "cl100k_base.tiktoken").write_bytes(b"aGVsbG8= 0\n")
    with pytest.raises(CounterUnavailable, match="SHA-256"):
        await TiktokenCounter("cl100k_base", tmp_path).count_text("hello")


async def test_tiktoken_loads_a_local_encoding_file(tmp_path: Path) -> None:
    import base64
    import hashlib

    ranks = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello"]
    data = b"".join(base64.b64encode(tok) + b" %d\n" % i for i, tok in enumerate(ranks))
    (tmp_path / "tiny.tiktoken").write_bytes(data)
    spec = EncodingSpec("tiny.tiktoken", hashlib.sha256(data).hexdigest(), r"\S+|\s+", {"<|end|>": 260})
    counter = TiktokenCounter("tiny", tmp_path, specs={"tiny": spec})
    assert await counter.count_text("hello hello") == TokenCount(3, "tiktoken:tiny", exact=False)
    assert (await counter.count_chat([{"role": "user", "content": "hello"}])).tokens == 1 + 3 + 3


async def test_estimate_is_conservative_and_flagged() -> None:
    estimate = EstimateCounter(bytes_per_token=4, safety_margin=0.5, per_message_tokens=2, per_request_tokens=3)
    assert await estimate.count_text("x" * 40, add_special=False) == TokenCount(15, "estimate", False)
    chat = await estimate.count_chat([{"role": "user", "content": "x" * 40, "images": ["a", "b"]}])
    assert chat.tokens == 15 + 2 + 3 + 2 * 768
    assert (await estimate.count_text(b"\xff" * 8)).tokens == 4
    with pytest.raises(ValueError, match="bytes_per_token"):
        EstimateCounter(bytes_per_token=0)


class _Down:
    name = "down"

    async def count_chat(self, messages: Any, tools: Any = ()) -> TokenCount:
        raise CounterUnavailable(self.name, "backend down")

    async def count_text(self, text: str | bytes, *, add_special: bool = True) -> TokenCount:
        raise CounterUnavailable(self.name, "backend down")


async def test_chain_uses_the_first_available_and_raises_when_none_is() -> None:
    down: Counter = _Down()
    chain = CounterChain("m", [down, EstimateCounter()])
    assert isinstance(chain, Counter)
    assert (await chain.count_text("hello")).counter == "estimate"
    with pytest.raises(CounterUnavailable, match="no counter could count for model 'm'"):
        await CounterChain("m", [down]).count_chat(CHAT)
    with pytest.raises(ValueError, match="at least one"):
        CounterChain("m", [])


async def test_chain_calibrates_learning_counters() -> None:
    overhead = OverheadEstimator(default_per_message_tokens=50, default_per_request_tokens=500)
    gguf = TokenizerCounter(_gguf("gpt-2"), model="m", overhead=overhead)
    chain = CounterChain("m", [_Down(), gguf, EstimateCounter()])
    before = await chain.count_chat(CHAT)
    content = await gguf.content_tokens(CHAT)
    await chain.calibrate(CHAT, [], content + 9)
    after = await chain.count_chat(CHAT)
    assert after.counter == "gguf" and after.tokens == content + 9 < before.tokens


async def test_calibration_takes_the_contents_tokens_from_the_requests_count_of_the_same_counter() -> None:
    """Calibration after a reply reuses the contents' tokens of the request's own count (no second tokenization),
    but only a count by the same counter: another counter's figure is not this tokenizer's."""
    def chain_of() -> tuple[CounterChain, TokenizerCounter]:
        overhead = OverheadEstimator(default_per_message_tokens=50, default_per_request_tokens=500)
        gguf = TokenizerCounter(_gguf("gpt-2"), model="m", overhead=overhead)
        return CounterChain("m", [gguf, EstimateCounter()]), gguf

    chain, gguf = chain_of()
    counted = await chain.count_chat(CHAT)
    content = await gguf.content_tokens(CHAT)
    assert counted.content_tokens == content and not counted.exact
    cases = {  # what the count says the contents are -> the overhead then learned from a prompt of content + 9
        "the request's count": (counted, 9),
        "the same counter, a made-up figure": (TokenCount(0, "gguf", False, content_tokens=content - 4), 13),
        "another counter's count": (TokenCount(0, "estimate", False, content_tokens=content - 4), 9),
        "no count": (None, 9),
    }
    for case, (given, overhead) in cases.items():
        chain, gguf = chain_of()
        await chain.calibrate(CHAT, [], content + 9, given)
        learned = await chain.count_chat(CHAT)
        print(f"{case:36} -> learned overhead {learned.tokens - content}")
        assert learned.tokens - content == overhead, case


async def test_factory_orders_counters_per_backend_kind(tmp_path: Path) -> None:
    from gateway.tokens.factory import CountingSettings

    settings = CountingSettings(
        cache_dir=tmp_path,
        gguf_paths={"local": vocab_path("llama-bpe")},
        tokenizer_json={"local": tmp_path / "tokenizer.json"},
        tiktoken_encoding="o200k_base",
        tiktoken_dir=tmp_path,
    )
    async with aiohttp.ClientSession() as session:
        llama = runtime_for(BackendKind.LLAMA_SERVER).counter_chain(
            "local", client=BackendClient(session, "http://x"), settings=settings
        )
        ollama = runtime_for(BackendKind.OLLAMA).counter_chain(
            "qwen", client=BackendClient(session, "http://x"), settings=settings
        )
        openai = runtime_for(BackendKind.OPENAI).counter_chain(
            "gpt", client=BackendClient(session, "http://x"), settings=settings
        )
    assert [c.name for c in llama.counters] == [
        "llama-server",
        "gguf",
        "tokenizer.json",
        "tiktoken:o200k_base",
        "estimate",
    ]
    assert [c.name for c in ollama.counters] == ["gguf", "tiktoken:o200k_base", "estimate"]
    assert [c.name for c in openai.counters] == ["backend", "tiktoken:o200k_base", "estimate"]  # its /tokenize first


async def test_probe_chat_template_reads_props_and_tolerates_failures() -> None:
    from gateway.tokens.llama_server_counter import probe_chat_template

    async def props(request: web.Request) -> web.Response:
        return web.json_response({"chat_template": "", "default_generation_settings": {}})

    async def broken(request: web.Request) -> web.Response:
        return web.Response(text="not json")

    async with serve({("GET", "/props"): props}) as url, aiohttp.ClientSession() as session:
        assert await probe_chat_template(BackendClient(session, url)) == "chatml"
    async with serve({("GET", "/props"): broken}) as url, aiohttp.ClientSession() as session:
        assert await probe_chat_template(BackendClient(session, url)) is None
        assert await probe_chat_template(BackendClient(session, url + "/nowhere")) is None
