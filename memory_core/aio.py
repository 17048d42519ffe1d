"""The asyncio clients: SQLAlchemy's asyncio engine on psycopg 3, and redis.asyncio.

Created on first use and kept per event loop and URL — an asyncio connection belongs to the
loop that opened it — so a service makes no connection per call. Tuned like the blocking ones
(memory_core/db.py, memory_core/redis_client.py): fail fast, never log bound parameters.
`aclose_connections()` closes the current loop's (a service's shutdown, a test's teardown).

Why psycopg 3: it is the driver LangGraph's `AsyncPostgresSaver` needs (one driver, one set of
libpq connection options for both), it speaks libpq like the sync path's psycopg2 (same
`connect_timeout`, SSL and service-file behaviour, same SQLSTATEs), and it prepares hot
statements server-side after a few executions. asyncpg is faster on raw benchmarks but would
add a second driver with its own error classes and prepared-statement caveats behind
PgBouncer.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

ASYNC_DRIVER = "postgresql+psycopg"

# loop -> {url: client}; a loop that is garbage-collected takes its entries with it.
_ENGINES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncEngine]] = (
    weakref.WeakKeyDictionary()
)
_REDIS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, aredis.Redis]] = (
    weakref.WeakKeyDictionary()
)


def async_database_url(url: str) -> str:
    """`postgresql://…` (the sync driver's URL) as the asyncio driver's URL."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError("DATABASE_URL must be a postgresql:// URL")
    return parsed.set(drivername=ASYNC_DRIVER).render_as_string(hide_password=False)


def make_async_engine(url: str) -> AsyncEngine:
    return create_async_engine(
        async_database_url(url),
        pool_recycle=1800,
        pool_size=5,
        max_overflow=10,
        connect_args={"connect_timeout": 5, "application_name": "agent-memory"},
        hide_parameters=True,
    )


def make_async_redis(url: str, *, socket_timeout: float = 2.0) -> aredis.Redis:
    return aredis.Redis.from_url(
        url,
        socket_connect_timeout=1.0,
        socket_timeout=socket_timeout,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 1),
        decode_responses=False,
    )


def _per_loop(registry: weakref.WeakKeyDictionary[Any, dict[str, Any]]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    found = registry.get(loop)
    if found is None:
        found = registry[loop] = {}
    return found


def get_async_engine(url: str) -> AsyncEngine:
    """The running loop's engine for `url` (call from a coroutine)."""
    engines = _per_loop(_ENGINES)
    if url not in engines:
        engines[url] = make_async_engine(url)
    return engines[url]


def get_async_redis(url: str) -> aredis.Redis:
    """The running loop's Redis client for `url` (call from a coroutine)."""
    clients = _per_loop(_REDIS)
    if url not in clients:
        clients[url] = make_async_redis(url)
    return clients[url]


async def aclose_connections() -> None:
    """Close every pooled asyncio connection of the running loop (created again on next use)."""
    loop = asyncio.get_running_loop()
    engines = _ENGINES.pop(loop, {})
    clients = _REDIS.pop(loop, {})
    for engine in engines.values():
        await engine.dispose()
    for client in clients.values():
        await client.aclose()
