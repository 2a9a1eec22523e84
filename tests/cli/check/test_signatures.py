"""The signature table, table-tested: every example line is attributed to its own signature (the first that matches;
the generic ones come last), and the matrix (example x signature) is printed."""

from __future__ import annotations

import pytest

from gateway.cli.check.signatures import SIGNATURES, classify, match_signatures

EXTRA = [  # (line, expected code): real wordings beyond each signature's own example
    ("llama-server reported out-of-memory during startup: ggml_backend_cuda_buffer_type_alloc_buffer: allocating "
     "7124.00 MiB on device 0: cudaMalloc failed: out of memory", "ollama_startup_oom"),
    ("model runner has unexpectedly stopped, this may be due to resource limitations or an internal error, check "
     "ollama server logs for details: CUDA error: out of memory", "runner_stopped"),
    ('{"error":{"code":400,"message":"request (2122 tokens) exceeds the available context size (2048 tokens), try '
     'increasing it","type":"exceed_context_size_error"}}', "prompt_exceeds_slot"),
    ("decode() failed: Context size has been exceeded.", "unified_pool_exceeded"),
    ("[12345.678] Out of memory: Killed process 777 (llama-server) total-vm:1kB", "oom_killer"),
    ("time=... level=WARN msg=\"runtime OOM detected; expiring loaded models\"", "runtime_oom"),
    ("hipMalloc failed: out of memory", "gpu_alloc_failed"),
    ("level=INFO msg=\"loaded runners\" count=1", None),
]


def test_each_example_is_its_own_signature_only_and_the_matrix_prints(capsys: pytest.CaptureFixture[str]) -> None:
    codes = [s.code for s in SIGNATURES]
    header = "example of \\ matches " + " ".join(f"{i:>2}" for i in range(len(codes)))
    rows = [header]
    for row, signature in enumerate(SIGNATURES):
        cells = ["X" if s.pattern.search(signature.example) else "." for s in SIGNATURES]
        rows.append(f"{row:>2} {signature.code:<28} " + " ".join(f"{c:>2}" for c in cells))
        hit = classify(signature.example)
        assert hit is not None and hit[0].code == signature.code, signature.code
    with capsys.disabled():
        print("\n" + "\n".join(rows))


@pytest.mark.parametrize(("line", "expected"), EXTRA)
def test_real_wordings(line: str, expected: str | None) -> None:
    hit = classify(line)
    assert (hit[0].code if hit else None) == expected


def test_match_counts_and_groups() -> None:
    text = "\n".join(["request (3000 tokens) exceeds the available context size (2048 tokens), try increasing it"] * 3
                     + ["Killed"])
    found = {m.signature.code: m for m in match_signatures([text])}
    assert found["prompt_exceeds_slot"].count == 3
    assert found["prompt_exceeds_slot"].groups == {"prompt": "3000", "slot": "2048"}
    assert found["killed"].count == 1
    assert [m.signature.code for m in match_signatures([text])] == ["prompt_exceeds_slot", "killed"]
