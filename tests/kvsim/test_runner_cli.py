"""The CLI half: argparse arguments to a SimConfig, and validation of bad values."""

from __future__ import annotations

import argparse

import pytest

from kvsim.config import SimConfig
from kvsim.gpu.vgpu import GIB
from kvsim.ollama.godur import FOREVER_S
from kvsim.runner import add_sim_arguments, sim_config_from_args


def parse(*argv: str) -> SimConfig:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    return sim_config_from_args(parser.parse_args(argv))


def test_defaults_are_sim_config_defaults() -> None:
    assert parse() == SimConfig()


def test_arguments_map_to_the_config() -> None:
    cfg = parse(
        "--gpu",
        "24GiB",
        "--gpu",
        "16GiB",
        "--models",
        "llama3.1:8b, phi3:mini",
        "--num-parallel",
        "4",
        "--keep-alive",
        "-1",
        "--era",
        "e2",
        "--response-tokens",
        "5:9",
        "--kv-cache-type",
        "q8_0",
        "--mode",
        "llama-server",
        "--parallel",
        "2",
        "--no-kv-unified",
        "--dynamic-kv",
    )
    assert cfg.gpu_bytes == (24 * GIB, 16 * GIB) and cfg.models == ("llama3.1:8b", "phi3:mini")
    assert (cfg.num_parallel, cfg.keep_alive_s, cfg.era, cfg.min_response_tokens, cfg.max_response_tokens) == (
        4,
        FOREVER_S,
        "e2",
        5,
        9,
    )
    assert (cfg.mode, cfg.n_parallel, cfg.kv_unified, cfg.dynamic_kv, cfg.kv_cache_type) == (
        "llama-server",
        2,
        False,
        True,
        "q8_0",
    )
    assert parse("--keep-alive", "30s").keep_alive_s == 30.0 and parse("--keep-alive", "90").keep_alive_s == 90.0


@pytest.mark.parametrize("argv", [("--gpu", "lots"), ("--keep-alive", "-1x"), ("--response-tokens", "a:b")])
def test_bad_values_are_usage_errors(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)


def test_config_validation_and_tiers() -> None:
    with pytest.raises(ValueError, match="unknown KV cache type"):
        SimConfig(kv_cache_type="q3")
    with pytest.raises(ValueError, match="num_parallel"):
        SimConfig(num_parallel=0)
    assert SimConfig(gpu_bytes=(16 * GIB,)).default_num_ctx == 4096
    assert SimConfig(gpu_bytes=(24 * GIB,)).default_num_ctx == 32768
    assert SimConfig(gpu_bytes=(24 * GIB, 24 * GIB)).default_num_ctx == 262144
    assert SimConfig(gpu_bytes=(24 * GIB,), gpu_overhead_bytes=2 * GIB).default_num_ctx == 4096
    assert SimConfig(context_length=8192).default_num_ctx == 8192
    assert SimConfig(gpu_bytes=(8 * GIB, 8 * GIB)).max_runners == 6
