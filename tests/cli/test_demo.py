"""`kvgate demo`: the same workload straight at the simulator and through kvgate; kvgate prevents the failures.

The demo's simulator runs 4x simulated time; here 50 times faster still (``DEMO_SPEEDUP``): the same workload, the same
outcomes and the same table in a fraction of the time (what is left is mostly kvgate loading two tokenizers). The
simulator's tokenizers are built in the fixture, through the run's shared tokenizer cache.
"""

from __future__ import annotations

import dataclasses
import io

import pytest

from gateway.cli.demo import run
from gateway.cli.main import build_parser
from kvsim.config import SimConfig
from kvsim.workload import workload
from tests.tokens.vocab_vectors import warm_sim_tokenizers

DEMO_SPEEDUP = 50.0


@pytest.fixture
def faster() -> SimConfig:
    """The demo's simulator, DEMO_SPEEDUP times faster, its tokenizers built (from the run's cache) beforehand."""
    config = workload.demo_sim_config()
    cache = warm_sim_tokenizers(*config.models)
    return dataclasses.replace(config, time_scale=config.time_scale * DEMO_SPEEDUP, tokenizer_cache_dir=cache)


def _table(text: str, prefix: str = "") -> dict[str, tuple[str, str]]:
    """The demo table's rows (those whose label starts with ``prefix``, which is dropped): label -> (direct, kvgate)."""
    rows = {}
    for line in text.splitlines():
        parts = line.rsplit(maxsplit=2)
        if len(parts) == 3 and line.startswith(prefix) and (parts[1] == "-" or parts[1].replace(".", "").isdigit()):
            rows[parts[0].removeprefix(prefix).strip()] = (parts[1], parts[2])
    return rows


async def _demo(part: str, config: SimConfig) -> str:
    out = io.StringIO()
    assert await run(build_parser().parse_args(["demo", "--part", part]), out=out, sim_config=config) == 0
    print(out.getvalue())
    return out.getvalue()


async def test_demo_shows_kvgate_preventing_oom_truncation_and_reloads(faster: SimConfig) -> None:
    text = await _demo("one-model", faster)
    table = {label: (float(a), float(b)) for label, (a, b) in _table(text).items()}
    assert table["failed: out of memory"][0] > 0 and table["failed: out of memory"][1] == 0
    assert table["silently truncated"][0] > 0 and table["silently truncated"][1] == 0
    assert table["model reloads"][0] > 0 and table["model reloads"][1] == 0
    assert table["completed"][1] == table["requests"][1]
    assert "3 models: " not in text


async def test_demo_three_models_and_a_foreign_process(faster: SimConfig) -> None:
    """The multi-model part (kvsim.workload.multi_model): its rows, "3 models: ...", direct then through kvgate."""
    text = await _demo("three-models", faster)
    multi = _table(text, "3 models: ")
    assert int(multi["failed: out of memory"][0]) > 0 and multi["failed: out of memory"][1] == "0"
    assert multi["loads that hit OOM (GPU)"][1] == "0" and multi["runner crashes: OOM (GPU)"][1] == "0"
    assert multi["refused (503, Retry-After)"][0] == "0" and int(multi["refused (503, Retry-After)"][1]) > 0
    assert multi["loads by kvgate"][0] == "-" and multi["unloads by kvgate"][0] == "-"
    assert 0 < int(multi["loads by kvgate"][1]) <= int(multi["model switches"][1])  # one load per switch at most
    assert multi["loads (GPU)"][1] == multi["loads by kvgate"][1]  # every load on the GPU went through kvgate


async def test_demo_keeps_its_own_backend_under_the_images_environment(
        faster: SimConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container is pointed at its server with KVGATE_BACKEND__URL (docker-compose.yml): ``kvgate demo`` run in it
    must still put kvgate in front of its own simulator (it once sent every request there, and all 21 failed)."""
    monkeypatch.setenv("KVGATE_BACKEND__URL", "http://127.0.0.1:9")
    monkeypatch.setenv("KVGATE_BACKEND__PARALLEL", "1")
    table = _table(await _demo("one-model", faster))
    assert table["completed"][1] == table["requests"][1]
