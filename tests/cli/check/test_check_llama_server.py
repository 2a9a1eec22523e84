"""``kvgate check`` against a real llama-server (a tiny model): slots, per-slot context, unified or split, cache
type and flash attention read from /props, /slots and the server's own log (``--log``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.check import command as check_cli
from gateway.cli.main import build_parser
from tests.cli.check.test_check_sim import _host
from tests.support.llama_server import run_llama_server
from tests.support.tinymodel import write_tiny_model

pytest_plugins = ["tests.conftest_llama"]

CASES = [  # (server args, slots, per-slot context, unified, cache type, flash attention)
    (("-c", "4096", "-fa", "on"), 4, 4096, True, "f16", True),
    (("-c", "4096", "-np", "2", "-fa", "off"), 2, 2048, False, "f16", False),
    (("-c", "2048", "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"), 1, 2048, False, "q8_0", True),
]


@pytest.mark.parametrize(("server_args", "slots", "per_slot", "unified", "cache", "flash"), CASES)
async def test_layout_cache_type_and_flash_attention_are_read(
    llama_server_bin: Path, capsys: pytest.CaptureFixture[str], server_args: tuple[str, ...], slots: int,
    per_slot: int, unified: bool, cache: str, flash: bool,
) -> None:
    model = write_tiny_model(n_ctx_train=8192, head_dim=32)  # q8_0 needs head sizes divisible by 32
    with run_llama_server(model, *server_args, log_verbosity=4, binary=llama_server_bin) as server:
        args = build_parser().parse_args(["check", "--json", "--backend", f"llama-server={server.url}",
                                          "--log", str(server.log_path)])
        await check_cli.run(args, host_reader=_host)
    found: dict[str, Any] = {f["code"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    pool = found.get("unified_pool") or found["slots"]
    assert pool["data"]["slots"] == slots
    assert pool["data"]["slot_context_tokens"] == per_slot
    assert pool["data"]["unified"] is unified
    assert ("unified_pool" in found) is (unified and slots > 1)
    cache_finding = found.get("kv_cache_type") or found["kv_cache_f16"]
    flash_text = "on" if flash else "off"
    assert f"K={cache} V={cache}, flash attention {flash_text}" in cache_finding["what"]
