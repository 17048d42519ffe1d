"""The async API's suite: every behaviour through both doors (`api`: sync, async)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memory_core import RedisConversationMemory
from memory_core.devservices.ports import free_port
from tests.support.api import KINDS, Api, AsyncApi, SyncApi, make_api, memory_at


@pytest.fixture(params=KINDS)
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    """The public API through one door; the async one on a loop of its own, closed after."""
    adapter = make_api(request.param)
    yield adapter
    adapter.close()


@pytest.fixture
def both() -> Iterator[tuple[SyncApi, AsyncApi]]:
    """Both doors at once, for tests that interleave them on the same threads."""
    sync, async_ = SyncApi(), AsyncApi()
    yield sync, async_
    async_.close()


@pytest.fixture
def offline() -> Iterator[RedisConversationMemory]:
    """A memory whose Redis is down (nothing listens on its port), for the sync and the async
    clients alike; Postgres is the session's."""
    memory = memory_at(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    yield memory
    memory.redis.close()
