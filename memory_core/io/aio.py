"""The asyncio clients: SQLAlchemy's asyncio engine on psycopg 3, and redis.asyncio.

Created on first use and kept per event loop and URL — an asyncio connection belongs to the
loop that opened it — so a service makes no connection per call. Tuned like the blocking ones
(memory_core/io/db.py, memory_core/io/redis_client.py): fail fast, never log bound parameters.
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
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote

import redis
import redis.asyncio as aredis

# Imported now, not on the event loop at the first call (psycopg's import takes ~0.1-0.2 s).
import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from memory_core.io.redis_kinds import AsyncRedis, cluster_seeds, cluster_startup, is_cluster_url

T = TypeVar("T")
ASYNC_DRIVER = "postgresql+psycopg"
# Connections to one Redis per loop; a caller beyond waits up to the socket timeout, then the
# read degrades to Postgres like any Redis error. A read waiting for a turn holds one.
ASYNC_REDIS_MAX_CONNECTIONS = 64
# Threads publishing to the broker (kombu has no asyncio producer). Its own pool, so a stuck
# broker never starves the loop's default executor, which resolves host names.
PUBLISH_THREADS = 4
_MAX_LOOPS = 32


class _PerLoop:
    """{loop: {url: client}}. An entry of a closed loop is dropped at the next look-up (its
    sockets close when collected): `asyncio.run()` per call must not pile up connections."""

    def __init__(self) -> None:
        self.loops: dict[asyncio.AbstractEventLoop, dict[str, Any]] = {}

    def current(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        found = self.loops.get(loop)
        if found is None:
            for old in [old for old in self.loops if old.is_closed()]:
                del self.loops[old]
            while len(self.loops) >= _MAX_LOOPS:  # many live loops: forget the oldest
                del self.loops[next(iter(self.loops))]
            found = self.loops[loop] = {}
        return found


_ENGINES = _PerLoop()
_REDIS = _PerLoop()
_WAITS = _PerLoop()
_PUBLISHER: dict[int, ThreadPoolExecutor] = {}  # by pid: a forked child has no threads


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
        pool_use_lifo=True,  # as the blocking pool (memory_core/io/db.py)
        pool_size=5,
        max_overflow=10,
        connect_args={"connect_timeout": 5, "application_name": "agent-memory-async"},
        hide_parameters=True,
    )


def make_async_redis(url: str, *, socket_timeout: float = 2.0) -> AsyncRedis:
    if is_cluster_url(url):
        return _make_async_cluster(url, socket_timeout=socket_timeout)
    pool = aredis.BlockingConnectionPool.from_url(
        url,
        max_connections=ASYNC_REDIS_MAX_CONNECTIONS,
        timeout=socket_timeout,  # waiting for a free connection
        socket_connect_timeout=1.0,
        socket_timeout=socket_timeout,
        health_check_interval=30,
        # One quick retry covers a stale pooled connection after a Redis restart; never
        # after a timeout (a hanging Redis costs one socket timeout per call).
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        decode_responses=False,
    )
    return aredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


def _make_async_cluster(url: str, *, socket_timeout: float) -> AsyncRedisCluster:
    found = cluster_seeds(url)
    return AsyncRedisCluster(
        startup_nodes=[AsyncClusterNode(host, port) for host, port in found.seeds],
        max_connections=ASYNC_REDIS_MAX_CONNECTIONS,  # per node
        socket_connect_timeout=1.0,
        socket_timeout=socket_timeout,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        decode_responses=False,
        username=found.username,
        password=found.password,
        ssl=found.ssl,
    )


def redis_url_of(client: Any) -> str:
    """The URL of the server a blocking redis-py client talks to (host or socket, database,
    credentials, TLS), so the asyncio side of a memory reaches the same Redis. For a cluster
    client: its seed nodes, as `redis+cluster://`."""
    if isinstance(client, RedisCluster):
        return _cluster_url_of(client)
    pool = client.connection_pool
    kw = pool.connection_kwargs
    user, password = kw.get("username") or "", kw.get("password") or ""
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}@" if user or password else ""
    if kw.get("path"):
        return f"unix://{auth}{kw['path']}?db={kw.get('db', 0)}"
    scheme = "rediss" if "SSL" in pool.connection_class.__name__ else "redis"
    return (
        f"{scheme}://{auth}{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
    )


def _cluster_url_of(client: RedisCluster) -> str:
    nodes, kw = cluster_startup(client)
    user, password = kw.get("username") or "", kw.get("password") or ""
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}@" if user or password else ""
    scheme = "rediss+cluster" if kw.get("ssl") else "redis+cluster"
    seeds = ",".join(f"{host}:{port}" for host, port in nodes)
    return f"{scheme}://{auth}{seeds}"


def get_async_engine(url: str) -> AsyncEngine:
    """The running loop's engine for `url` (call from a coroutine)."""
    engines = _ENGINES.current()
    if url not in engines:
        engines[url] = make_async_engine(url)
    return engines[url]


def get_async_redis(url: str) -> AsyncRedis:
    """The running loop's Redis client for `url` (call from a coroutine)."""
    clients = _REDIS.current()
    if url not in clients:
        clients[url] = make_async_redis(url)
    return clients[url]


def get_async_waits_redis(url: str) -> AsyncRedis:
    """The running loop's client for subscriptions (reads waiting for a turn), with a pool of
    its own: a crowd of waiting reads never takes the connections other calls need."""
    clients = _WAITS.current()
    if url not in clients:
        clients[url] = make_async_redis(url)
    return clients[url]


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the publish threads (a blocking broker call), awaited."""
    pool = _PUBLISHER.get(os.getpid())
    if pool is None:
        _PUBLISHER.clear()
        pool = _PUBLISHER[os.getpid()] = ThreadPoolExecutor(
            PUBLISH_THREADS, thread_name_prefix="memory-publish"
        )
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


async def aclose_connections(urls: Iterable[str] | None = None) -> None:
    """Close the running loop's pooled asyncio connections (of `urls`; default: all of them).

    For a shutdown: a call still in flight may fail. A later call opens new ones."""
    wanted = None if urls is None else set(urls)
    for registry in (_ENGINES, _REDIS, _WAITS):
        clients = registry.current()
        for url in [u for u in clients if wanted is None or u in wanted]:
            client = clients.pop(url)
            await (client.dispose() if isinstance(client, AsyncEngine) else client.aclose())
