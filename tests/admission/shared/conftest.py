"""One real redis-server per module of shared-ledger tests, emptied before each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from tests.support.redis_server import RunningRedis, running_redis


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RunningRedis]:
    with running_redis() as server:
        yield server


@pytest.fixture
async def redis_url(redis_server: RunningRedis) -> AsyncIterator[str]:
    client = aioredis.Redis.from_url(redis_server.url)
    await client.flushall()
    await client.aclose()
    yield redis_server.url
