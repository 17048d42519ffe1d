"""The clients a `RedisConversationMemory` talks through, blocking and asyncio.

The blocking ones are given or come from the settings' URLs (pooled per process); the asyncio
ones are given or come from the running loop's pools (memory_core/io/aio.py) for the *same*
servers as the blocking ones, so one memory never reads two copies. `sync_io` / `async_io`
hand them to the step drivers (memory_core/io/steps.py).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from memory_core.copy.working_copy import SCRIPT_SOURCES
from memory_core.io.aio import (
    aclose_connections,
    get_async_engine,
    get_async_redis,
    get_async_waits_redis,
    redis_url_of,
)
from memory_core.io.async_driver import AsyncIO
from memory_core.io.db import get_engine
from memory_core.io.redis_client import get_redis
from memory_core.io.redis_kinds import AsyncRedis, SyncRedis
from memory_core.io.sync_driver import SyncIO
from memory_core.settings import Settings


class MemoryClients:
    """Owns the connections of a memory; `aclose()` / `async with` at shutdown."""

    settings: Settings
    redis: SyncRedis
    engine: Engine

    def _init_clients(
        self,
        s: Settings,
        redis_client: SyncRedis | None,
        engine: Engine | None,
        async_redis: AsyncRedis | None,
        async_engine: AsyncEngine | None,
    ) -> None:
        self.redis = redis_client if redis_client is not None else get_redis(s.redis_url)
        self.engine = engine if engine is not None else get_engine(s.database_url)
        self._async_redis = async_redis
        self._async_engine = async_engine
        # The asyncio side reaches the same servers as the blocking clients, given or not.
        self._async_redis_url = s.redis_url if redis_client is None else redis_url_of(self.redis)
        self._async_database_url = (
            s.database_url if engine is None else engine.url.render_as_string(hide_password=False)
        )
        self._async_scripts: dict[int, tuple[AsyncRedis, dict[str, Any]]] = {}

    def sync_io(self) -> SyncIO:
        return SyncIO(self.engine, self.redis, self._sync_scripts())

    def _sync_scripts(self) -> dict[str, Any]:
        raise NotImplementedError

    def async_io(self) -> AsyncIO:
        """The asyncio clients of the running loop (call from a coroutine)."""
        client = self._async_redis or get_async_redis(self._async_redis_url)
        engine = self._async_engine or get_async_engine(self._async_database_url)
        found = self._async_scripts.get(id(client))
        if found is None or found[0] is not client:
            if len(self._async_scripts) > 8:  # one per loop in practice; never unbounded
                self._async_scripts.clear()
            scripts = {name: client.register_script(src) for name, src in SCRIPT_SOURCES.items()}
            found = self._async_scripts[id(client)] = (client, scripts)
        waits = client if self._async_redis else get_async_waits_redis(self._async_redis_url)
        return AsyncIO(engine, client, found[1], waits)

    async def aclose(self) -> None:
        """At shutdown: close the asyncio connections this memory reads and writes through on
        the running loop — the clients passed to it, or else the loop's pools for its URLs,
        which other memories on the loop share (they reconnect on their next call; a call in
        flight may fail). Create one memory per service, not one per request."""
        if self._async_redis is not None:
            await self._async_redis.aclose()
        if self._async_engine is not None:
            await self._async_engine.dispose()
        shared = [
            url
            for url, own in (
                (self._async_redis_url, self._async_redis),
                (self._async_database_url, self._async_engine),
            )
            if own is None
        ]
        await aclose_connections(shared)
        self._async_scripts.clear()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
