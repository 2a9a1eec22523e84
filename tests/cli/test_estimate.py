"""`kvgate estimate` through run(), capturing its output."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from gateway.cli.estimate import add_arguments, run
from tests.support.fake_backend import FakeLLM, OllamaModels, running, serve, text_answer
from tests.support.tinymodel import write_tiny_model

DATA = Path(__file__).parents[1] / "memory" / "data"


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvgate estimate")
    add_arguments(parser)
    return parser.parse_args(argv)


async def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await run(_parse(*argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


async def test_preset_table_at_128k() -> None:
    code, out, err = await _run("llama3.1:8b", "--context", "131072", "--vram", "24GiB")
    assert (code, err) == (0, "")
    assert "KV cache      16.00 GiB" in out
    assert "verdict       fits" in out


async def test_preset_json_at_8k_and_q8_0() -> None:
    code, out, _ = await _run("llama3.1:8b", "--context", "8192", "--vram", "24GiB", "--json")
    data = json.loads(out)
    assert (code, data["kv_bytes"], data["kv_bytes_per_token"], data["fits"]) == (0, 1024**3, 131072, True)
    _, out_q8, _ = await _run("llama3.1:8b", "--context", "131072", "-ctk", "q8_0", "-ctv", "q8_0", "--json",
                              "--vram", "24GiB")
    assert json.loads(out_q8)["kv_bytes"] == 8.5 * 1024**3


async def test_does_not_fit_exits_1() -> None:
    code, out, _ = await _run("llama3.1:70b", "--context", "131072", "--vram", "24GiB")
    assert code == 1
    assert "DOES NOT FIT" in out


async def test_gguf_path() -> None:
    model = write_tiny_model()
    code, out, _ = await _run(str(model), "--context", "2048", "--parallel", "2", "--vram", "1GiB", "--json")
    data = json.loads(out)
    assert (code, data["kv_bytes"], data["source"]) == (0, 1024 * 1024, "gguf")


async def test_model_on_a_backend() -> None:
    models = OllamaModels({"llama3.1:8b": ("ggml-vocab-llama-bpe.gguf", "sha256:x")})
    async with running(FakeLLM(answers=models.answers())) as fake:
        code, out, _ = await _run("llama3.1:8b", "--backend", fake.url, "--vram", "24GiB", "--json")
    data = json.loads(out)
    assert (code, data["source"], data["context"], data["kv_bytes"]) == (0, "ollama", 8192, 1024**3)


async def test_vram_from_an_exporter() -> None:
    text = (DATA / "dcgm_exporter_h200.txt").read_text()
    async with serve({("GET", "/metrics"): text_answer(text)}) as base:
        code, out, _ = await _run("llama3.1:70b", "--context", "131072", "--vram", f"{base}/metrics", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["vram_free_bytes"] == 140581 * 1024 * 1024


async def test_auto_vram_without_a_driver_gives_no_verdict() -> None:
    code, out, _ = await _run("qwen2.5:7b", "--vram", "auto")
    assert code == 0
    assert "verdict" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("no-such-model",), "not a preset"),
        (("missing.gguf",), "no GGUF file at missing.gguf"),
        (("llama3.1:8b", "--vram", "lots"), "cannot read 'lots' as a size"),
        (("llama3.1:8b", "--context", "-5"), "must be > 0"),
        (("llama3.1:8b", "--backend", "http://127.0.0.1:9"), "answers neither"),
        (("llama3.1:8b", "--quantization", "Q2_K"), "allowed: Q4_K_M, Q8_0, F16"),
    ],
)
async def test_bad_input_exits_2_with_a_message(argv: tuple[str, ...], message: str) -> None:
    code, out, err = await _run(*argv)
    assert (code, out) == (2, "")
    assert message in err


def test_bad_cache_type_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("llama3.1:8b", "--cache-type-k", "q3_k")
    assert "allowed: f32, f16, bf16, q8_0" in capsys.readouterr().err
