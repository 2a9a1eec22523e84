"""Table tests of the simulator's pure parts: durations, options and reloads, truncation, Go JSON, placement."""

from __future__ import annotations

import json

import pytest

from kvsim.catalog import CATALOG
from kvsim.failures import SimError
from kvsim.gpu.load_cost import auto_batch_e3, batch_surcharge, place, predicted_vram_e3
from kvsim.gpu.vgpu import GIB, DeviceSpec, VirtualGpu
from kvsim.ollama.godur import FOREVER_S, DurationError, parse_go_duration, parse_keep_alive
from kvsim.ollama.gojson import dumps, read_object
from kvsim.ollama.options import LoadedState, OptionError, parse_options, schedule_num_ctx
from kvsim.ollama.options import needs_reload as reload_needed
from kvsim.ollama.prompting import (
    INPUT_TOO_LONG,
    PROMPT_TOO_LONG,
    chat_prompt,
    context_shift_limit,
    exceed_context_body,
    fit_tokens_e2,
    fit_tokens_e3,
)
from kvsim.templates import Message, collate, render
from kvsim.vocab import tokenizer_for


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (5, 5.0),
        (0, 0.0),
        (2.5, 2.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("300ms", 0.3),
        ("0", 0.0),
        (".5s", 0.5),
        (-1, FOREVER_S),
        ("-1m", FOREVER_S),
    ],
)
def test_keep_alive_values(value: object, seconds: float) -> None:
    assert parse_keep_alive(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", 'time: missing unit in duration "-1"'),
        ("5", 'time: missing unit in duration "5"'),
        ("5x", 'time: unknown unit "x" in duration "5x"'),
        ("abc", 'time: invalid duration "abc"'),
        (True, "Unsupported type: 'bool'"),
        ([1], "Unsupported type: '[]interface {}'"),
    ],
)
def test_keep_alive_errors_are_gos(value: object, message: str) -> None:
    with pytest.raises(DurationError) as err:
        parse_keep_alive(value)
    assert str(err.value) == message


def test_go_duration_components() -> None:
    assert parse_go_duration("1m30.5s") == pytest.approx(90.5)
    assert parse_go_duration("-2h") == -7200


def test_options_defaults_and_precedence() -> None:
    opts = parse_options(None, modelfile={}, default_num_ctx=32768, context_length_env=0, embedding=False)
    assert (opts.runner.num_ctx, opts.num_ctx_auto, opts.num_keep, opts.num_predict) == (32768, True, 4, -1)
    opts = parse_options(
        {"num_ctx": 8192.0, "bogus": 1},
        modelfile={"num_ctx": 4096},
        default_num_ctx=32768,
        context_length_env=0,
        embedding=False,
    )
    assert (opts.runner.num_ctx, opts.num_ctx_auto) == (8192, False)
    opts = parse_options(
        None, modelfile={"num_ctx": 4096}, default_num_ctx=32768, context_length_env=0, embedding=False
    )
    assert (opts.runner.num_ctx, opts.num_ctx_auto) == (4096, False)
    assert (
        parse_options(None, modelfile={}, default_num_ctx=1, context_length_env=0, embedding=True).runner.num_batch == 1
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"num_ctx": "8k"}, 'option "num_ctx" must be of type integer'),
        ({"temperature": "hot"}, 'option "temperature" must be of type float32'),
        ({"use_mmap": 1}, 'option "use_mmap" must be of type boolean'),
        ({"stop": "x"}, 'option "stop" must be of type array'),
        ({"stop": [1]}, 'option "stop" must be of an array of strings'),
    ],
)
def test_wrong_option_types(raw: dict[str, object], message: str) -> None:
    with pytest.raises(OptionError) as err:
        parse_options(raw, modelfile={}, default_num_ctx=4096, context_length_env=0, embedding=False)
    assert str(err.value) == message


def _loaded(num_ctx: int, *, auto: bool = False, shift: bool = True) -> LoadedState:
    opts = parse_options(
        None if auto else {"num_ctx": num_ctx},
        modelfile={},
        default_num_ctx=num_ctx,
        context_length_env=0,
        embedding=False,
    )
    return LoadedState(opts.runner, opts.num_ctx_auto, opts.num_batch_auto, shift, 131072)


@pytest.mark.parametrize(
    ("loaded", "raw", "shift", "era", "reload"),
    [
        (_loaded(8192), {"num_ctx": 8192}, True, "e3", False),
        (_loaded(8192), {"num_ctx": 4096}, True, "e3", True),  # smaller reloads too
        (_loaded(8192), {"num_ctx": 16384}, True, "e3", True),
        (_loaded(131072), {"num_ctx": 200000}, True, "e3", False),  # both clamp to the trained context
        (_loaded(131072), {"num_ctx": 200000}, True, "e2", True),  # E2 compares raw values
        (_loaded(32768, auto=True), None, True, "e3", False),
        (_loaded(8192), {"num_ctx": 8192}, False, "e3", True),  # shift differs
        (_loaded(8192), {"num_ctx": 8192, "num_gpu": -1}, True, "e3", False),
        (_loaded(8192), {"num_ctx": 8192, "num_gpu": 20}, True, "e3", True),
        (_loaded(8192), {"num_ctx": 8192, "temperature": 0.1, "num_predict": 5, "seed": 3}, True, "e3", False),
        (_loaded(8192), {"num_ctx": 8192, "num_batch": 1024}, True, "e3", True),
    ],
)
def test_needs_reload(loaded: LoadedState, raw: dict[str, object] | None, shift: bool, era: str, reload: bool) -> None:
    opts = parse_options(raw, modelfile={}, default_num_ctx=32768, context_length_env=0, embedding=False)
    assert reload_needed(loaded, opts, shift=shift, era=era) is reload


def test_schedule_num_ctx_clamps() -> None:
    assert schedule_num_ctx(1, vision=False) == 4
    assert schedule_num_ctx(1024, vision=True) == 2048


@pytest.mark.parametrize(
    ("num_ctx", "num_keep", "limit"), [(2048, 5, 1027), (2048, 4, 1026), (4096, 0, 2048), (8192, 5, 4099)]
)
def test_context_shift_limit_is_about_half(num_ctx: int, num_keep: int, limit: int) -> None:
    assert context_shift_limit(num_ctx, num_keep) == limit


def test_e3_token_truncation_keeps_head_and_tail() -> None:
    tokens = list(range(5000))
    fitted = fit_tokens_e3(tokens, num_ctx=2048, num_keep=4, adds_bos=True, shift=True, truncate=True)
    assert len(fitted) == 1027
    assert fitted[:5] == [0, 1, 2, 3, 4] and fitted[-1] == 4999 and fitted[5] == 5000 - 1022
    assert (
        fit_tokens_e3(tokens[:2047], num_ctx=2048, num_keep=4, adds_bos=True, shift=True, truncate=True)
        == tokens[:2047]
    )
    assert fit_tokens_e3(tokens, num_ctx=2048, num_keep=4, adds_bos=True, shift=True, truncate=False) == tokens
    with pytest.raises(SimError) as err:
        fit_tokens_e3(tokens, num_ctx=2048, num_keep=4, adds_bos=True, shift=False, truncate=True)
    assert (err.value.status, err.value.message) == (400, PROMPT_TOO_LONG)


def test_e2_token_truncation() -> None:
    fitted = fit_tokens_e2(list(range(3000)), num_ctx=2048, num_keep=4, truncate=True)
    assert len(fitted) == 2048 and fitted[:4] == [0, 1, 2, 3] and fitted[-1] == 2999
    with pytest.raises(SimError) as err:
        fit_tokens_e2(list(range(3000)), num_ctx=2048, num_keep=4, truncate=False)
    assert err.value.message == INPUT_TOO_LONG


def test_exceed_context_body_is_llama_servers() -> None:
    assert exceed_context_body(2122, 2048) == (
        '{"error":{"code":400,"message":"request (2122 tokens) exceeds the available context size (2048 tokens), '
        'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":2122,"n_ctx":2048}}'
    )


def test_chat_truncation_drops_oldest_keeps_system_and_last() -> None:
    spec = CATALOG["llama3.1:8b"]
    tok = tokenizer_for(spec)
    msgs = [
        Message("system", "Be brief."),
        *[Message("user" if i % 2 == 0 else "assistant", "word " * 200) for i in range(9)],
    ]
    full = chat_prompt(spec.template, tok, msgs, num_ctx=100_000, truncate=True, vision=False)
    assert full.dropped_messages == 0
    cut = chat_prompt(spec.template, tok, msgs, num_ctx=700, truncate=True, vision=False)
    assert 0 < cut.dropped_messages < 9 and len(cut.tokens) <= 700
    assert cut.text.startswith("<|start_header_id|>system<|end_header_id|>\n\nBe brief.")
    last = chat_prompt(spec.template, tok, msgs, num_ctx=10, truncate=True, vision=False)
    assert last.dropped_messages == 8  # only the last message (and the system one) remain
    off = chat_prompt(spec.template, tok, msgs, num_ctx=10, truncate=False, vision=False)
    assert off.dropped_messages == 0


def test_collate_and_render() -> None:
    system, msgs = collate([Message("system", "a"), Message("system", "b"), Message("user", "x"), Message("user", "y")])
    assert system == "a\n\nb" and [m.content for m in msgs] == ["a\n\nb", "x\n\ny"]
    assert render("llama3", [Message("user", "hi")]) == (
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render("qwen2", [Message("user", "hi")]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render("chatml", [Message("system", "s"), Message("user", "hi")]).count("<|im_start|>") == 3


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{bad", "invalid character 'b' looking for beginning of object key string"),
        (b"nope", "invalid character 'o' in literal null (expecting 'u')"),
        (b"?", "invalid character '?' looking for beginning of value"),
        (b'{"a":1 "b":2}', "invalid character '\"' after object key:value pair"),
        (b'{"a" 1}', "invalid character '1' after object key"),
        (b'{"a":[1 2]}', "invalid character '2' after array element"),
        (b'{"a":', "unexpected EOF"),
        (b"[]", "json: cannot unmarshal array into Go value of type api.ChatRequest"),
    ],
)
def test_go_json_errors(body: bytes, message: str) -> None:
    with pytest.raises(SimError) as err:
        read_object(body, "ChatRequest")
    assert (err.value.status, err.value.message) == (400, message)


def test_go_json_reads_one_value_and_escapes_html() -> None:
    assert read_object(b'{"a":1} trailing', "ChatRequest") == {"a": 1}
    with pytest.raises(SimError, match="missing request body"):
        read_object(b"  ", "ChatRequest")
    assert dumps({"t": "<a&b>"}) == b'{"t":"\\u003ca\\u0026b\\u003e"}'
    assert json.loads(dumps({"t": "<a&b>"})) == {"t": "<a&b>"}


def test_go_json_reads_lone_surrogates_and_bad_bytes_as_replacement_characters() -> None:
    body = b'{"model":"m\\udcff","messages":[{"content":"hi \\ud83d \\ud83d\\ude00 \xff"}]}'
    assert read_object(body, "ChatRequest") == {"model": "m\ufffd",
                                                "messages": [{"content": "hi \ufffd \U0001f600 \ufffd"}]}


def test_placement_prefers_one_gpu_then_splits() -> None:
    assert place(10, 10, {0: 100}) == {0: 10}
    assert place(10, 10, {0: 50, 1: 100}) == {1: 10}
    assert place(90, 90, {0: 60, 1: 60}) == {0: 45, 1: 45}


def test_e3_prediction_and_batch() -> None:
    spec = CATALOG["llama3.1:8b"]
    assert predicted_vram_e3(spec, ctx_total_tokens=8192) - spec.file_bytes == 2**30
    assert auto_batch_e3(4096, 5 * GIB, 24 * GIB) == 512
    assert auto_batch_e3(8192, 5 * GIB, 24 * GIB) == 1024
    assert auto_batch_e3(65536, 5 * GIB, 24 * GIB) == 2048
    assert auto_batch_e3(65536, 12 * GIB, 16 * GIB) == 1024  # 2048 needs the prediction within 60%
    assert auto_batch_e3(65536, 13 * GIB, 16 * GIB) == 512  # beyond 80%: no surcharge fits
    assert (batch_surcharge(512), batch_surcharge(1024), batch_surcharge(2048)) == (0, 768 * 2**20, 2 * GIB)


def test_virtual_gpu_allocates_all_or_nothing() -> None:
    gpu = VirtualGpu([DeviceSpec(0, 10 * GIB), DeviceSpec(1, 10 * GIB)])
    pid = gpu.spawn("runner")
    failure = gpu.try_allocate(pid, {0: 4 * GIB, 1: 11 * GIB})
    assert failure is not None and failure.device == 1 and gpu.used_bytes(0) == 0
    assert gpu.try_allocate(pid, {0: 4 * GIB, 1: 6 * GIB}) is None
    foreign = gpu.add_foreign("trainer", 0, 8 * GIB)
    assert gpu.oversubscribed(0) and gpu.free_bytes(0) == -2 * GIB
    snap = gpu.snapshot()
    assert snap.devices[0].free_bytes == 0 and {p.pid for p in snap.processes} == {pid, foreign}
    assert gpu.kill(foreign) and not gpu.oversubscribed(0)
    gpu.release(pid, {1: 6 * GIB})
    assert gpu.used_bytes(1) == 0
