"""A backend whose answer breaks off mid-way is taken out, as one that failed before answering is: the client already
has part of the answer, so that request can't move, but the next ones go to the other backend."""

from __future__ import annotations

import aiohttp

from tests.support.fake_backend import FakeLLM, running
from tests.support.gateway_server import running_gateway

CHAT = {"model": "llama3.1:8b", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_backend_whose_stream_breaks_off_is_taken_out() -> None:
    cutting = FakeLLM()
    cutting.script.disconnect_after_chunks = 1
    async with running(cutting), running(FakeLLM()) as steady, running_gateway(
        [{"name": "gpu0", "url": cutting.url}, {"name": "gpu1", "url": steady.url}], routing={"down_s": 30.0},
    ) as url, aiohttp.ClientSession() as http:
        rows = []
        for n in range(4):
            async with http.post(f"{url}/api/chat", json=CHAT) as response:
                body = await response.read()
                rows.append((n, response.headers.get("X-Kvgate-Backend"), b'"done":true' in body, b"error" in body))
        async with http.get(f"{url}/kvgate/status") as response:
            routing = {b["name"]: b["routing"] for b in (await response.json())["backends"]}
    print("\n" + "\n".join(f"  request {n}: {backend}, done {done}, error event {error}"
                           for n, backend, done, error in rows))
    print(f"  routing: {routing}")
    cut = [row for row in rows if row[1] == "gpu0"]
    assert len(cut) == 1 and not cut[0][2] and cut[0][3]  # one answer broke off, with an error event
    assert all(backend == "gpu1" and done for n, backend, done, _ in rows if n > cut[0][0])
    assert routing["gpu0"]["out_for_s"] is not None and "broke off mid-way" in routing["gpu0"]["out_reason"]
    assert routing["gpu1"]["out_for_s"] is None
