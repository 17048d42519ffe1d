"""Fixtures of the lifecycle tests: a private event stream (autouse), memories, owners."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import redis

from memory_core import (
    RedisConversationMemory,
)
from memory_core.events.stream import routine_stream
from memory_core.io.redis_client import make_redis
from memory_core.settings import get_settings, reset_settings_cache
from tests.support.lifecycle import Events

# ------------------------------------------------------------------ fixtures


@pytest.fixture(autouse=True)
def events(redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Iterator[Events]:
    """A private event stream for the test (on the session's Redis); `events()` reads it."""
    name = f"memory:events:lifecycle:{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MEMORY_EVENTS_STREAM", name)
    reset_settings_cache()

    def read() -> list[dict[str, str]]:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], redis_client.xrange(name))
        return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]

    yield read
    redis_client.delete(name, routine_stream(name))
    monkeypatch.undo()
    reset_settings_cache()


@pytest.fixture
def mem(redis_client: redis.Redis) -> RedisConversationMemory:
    """A memory on the session's Redis, with the default settings: a key prefix of the test's
    own would be recorded in memory_settings_seen, and every process of the next two hours
    (the CLI tests' commands among them) would warn that the settings disagree."""
    return RedisConversationMemory(redis_client)


@pytest.fixture
def other_process(mem: RedisConversationMemory) -> Iterator[RedisConversationMemory]:
    """Another process's memory: same Redis and prefix, its own client and parsed cache."""
    client = make_redis(get_settings().redis_url)
    yield RedisConversationMemory(client)
    client.close()


@pytest.fixture
def owner() -> str:
    return f"owner-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def log_text(caplog: pytest.LogCaptureFixture) -> Callable[[], str]:
    """Everything the library logged during the test, as text."""
    caplog.set_level(logging.DEBUG, logger="memory_core")
    return lambda: "\n".join(r.getMessage() for r in caplog.records)
