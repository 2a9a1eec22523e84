"""Issue 22, point 7, against a real llama-server (a tiny generated model; its text is random): the notice in the
server's own framings, as the official ``openai`` client and raw HTTP read them, and its bytes otherwise unchanged.

The same checks as test_notice.py (whose helpers this uses), with the llama-server's real streams instead of the
simulator's: OpenAI chat and completion chunks (a role-only first chunk, timings in the last), the native
/completion events, and Anthropic's /v1/messages events.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_notice import TENANTS, Route, ask, bytes_check, expected_line
from tests.support.gateway_server import running_gateway
from tests.support.llama_server import RunningLlamaServer, run_llama_server
from tests.support.tap import tapped
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.llama_server

TEMPLATE = Path(__file__).parents[1] / "tokens" / "data" / "llama-3.1-instruct.jinja"
CONTEXT = 1024
ROUTES = tuple(Route("cpp", path, chat, client, "tiny", CONTEXT) for path, chat, client in (
    ("/v1/chat/completions", True, "openai"), ("/v1/completions", False, "openai"), ("/completion", False, "http"),
    ("/v1/messages", True, "http")))


@pytest.fixture(scope="module")
def server(llama_server_bin: Path) -> Iterator[RunningLlamaServer]:
    model = write_tiny_model(n_ctx_train=4096)
    args = ("-c", str(CONTEXT), "-np", "1", "-a", "tiny", "--chat-template-file", str(TEMPLATE), "-t", "2")
    with run_llama_server(model, *args, binary=llama_server_bin) as running:
        yield running


async def test_the_notice_in_a_real_llama_servers_framings(server: RunningLlamaServer) -> None:
    rows: list[tuple[str, ...]] = []
    async with tapped(server.url) as tap:
        backends: list[dict[str, Any]] = [{"name": "cpp", "kind": "llama-server", "url": tap.url}]
        async with running_gateway(backends, tenants=TENANTS) as url:
            for route in ROUTES:
                for stream in (False, True):
                    for tenant in ("on", "off"):
                        reply = await ask(url, route, tenant, "trimmed", stream)
                        assert reply.status == 200, (route, reply.sent[:300])
                        line = expected_line(route, reply)
                        assert line is not None, reply.headers
                        shown = line if tenant == "on" else None
                        assert reply.text.startswith(line) is (shown is not None), (route, stream, reply.text[:200])
                        check = bytes_check(route, stream, reply, tap.last(route.path), shown)
                        rows.append((route.path, "stream" if stream else "whole", tenant, repr(reply.text[:60]),
                                     check))
    print(f"\n{'route':22} {'reply':6} {'notice':6} {'the client reads':64} bytes")
    for row in rows:
        print(f"{row[0]:22} {row[1]:6} {row[2]:6} {row[3]:64} {row[4]}")
