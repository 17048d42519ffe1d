"""Shared fixtures: real Postgres (schema built by `alembic upgrade head`) and real Redis."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from sqlalchemy import text

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.db import get_engine, reset_engines
from memory_core.migrate import upgrade
from memory_core.redis_client import get_redis, reset_redis_clients
from memory_core.settings import Settings, get_settings, reset_settings_cache
from tests._services import REPO_ROOT, bootstrap_services
from tests.reliability.services import make_data_dir, remove_tree
from tests.support.faults import FaultyRedis

BASE_TIME = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def pytest_configure(config: pytest.Config) -> None:
    services = bootstrap_services(config)
    # Test brokers live in their own Redis database (3-15 by pid, so concurrent sessions rarely
    # share one; 1-2 are left to the demo and developers): test jobs mix with nothing else
    # and can be purged freely.
    os.environ["CELERY_BROKER_URL"] = _with_db(services.redis_url, 3 + os.getpid() % 13)
    reset_settings_cache()


@pytest.fixture(scope="session", autouse=True)
def database() -> Iterator[str]:
    """A fresh schema for the run, built by migrating (never by create_all)."""
    url = get_settings().database_url
    engine = get_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    upgrade(url)
    yield url
    reset_engines()


@pytest.fixture(scope="session", autouse=True)
def _purge_test_broker() -> Iterator[None]:
    broker = redis.Redis.from_url(get_settings().celery_broker_url)
    broker.flushdb()
    yield
    broker.close()


@pytest.fixture
def settings() -> Settings:
    return get_settings()


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    yield get_redis()
    reset_redis_clients()


@pytest.fixture
def memory(redis_client: redis.Redis) -> RedisConversationMemory:
    return RedisConversationMemory(redis_client)


@pytest.fixture
def dead_redis() -> Iterator[redis.Redis]:
    """A client for a port where nothing listens: Redis is 'down'."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from memory_core.redis_client import make_redis

    client = make_redis(f"redis://127.0.0.1:{port}/0")
    yield client
    client.close()


@pytest.fixture(scope="module")
def faulty_redis() -> Iterator[FaultyRedis]:
    """A private Redis the module's tests may stop, fill or demote (tests/support/faults.py)."""
    data_dir = make_data_dir(REPO_ROOT / ".agent-memory" / "faulty-redis")
    server = FaultyRedis(data_dir)
    try:
        yield server
    finally:
        server.close()
        remove_tree(data_dir)


@pytest.fixture
def fresh_faulty_redis(faulty_redis: FaultyRedis) -> Iterator[FaultyRedis]:
    """`faulty_redis`, up, writable, empty, and put back so after the test."""
    faulty_redis.up()
    faulty_redis.admin.flushall()
    yield faulty_redis
    faulty_redis.up()


def make_snapshot(
    thread_id: uuid.UUID | str,
    n: int,
    *,
    owner_id: str = "user-42",
    agent_type: str = "chat",
    session_id: uuid.UUID | str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """The n-th turn of an analytics conversation, as an agent would send it (JSON dict)."""
    snap: dict[str, Any] = {
        "session_id": str(session_id or uuid.uuid4()),
        "thread_id": str(thread_id),
        "owner_id": owner_id,
        "agent_type": agent_type,
        "user_query": f"Revenue by region for {2000 + n}, excluding returns (turn {n})",
        "answer": f"Turn {n}: EMEA leads with 41% of revenue.",
        "sql": [
            f"SELECT region, SUM(revenue) AS revenue FROM sales WHERE year = {2000 + n} "
            "AND NOT is_return GROUP BY region"
        ],
        "visualizations": [
            {
                "id": 100 + n,
                "type": "CHART",
                "name": f"Revenue by region {n}",
                "options": {
                    "globalSeriesType": "column",
                    "columnMapping": {"region": "x", "revenue": "y"},
                    "legend": {"enabled": True},
                    "seriesOptions": {"revenue": {"color": "#ff0000"}},
                },
            }
        ],
        "dashboards": [{"id": 3, "name": "Sales", "widgets": [{"visualization_id": 100 + n}]}],
        "response_payload": {"blocks": [{"type": "text", "text": f"answer {n}"}]},
        "completed_at": (BASE_TIME + timedelta(minutes=n)).isoformat(),
    }
    snap.update(overrides)
    return snap


@pytest.fixture
def snapshot_factory() -> Callable[..., dict[str, Any]]:
    return make_snapshot
