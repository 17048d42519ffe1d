"""The public API through either door, behind one interface: `SyncApi` calls the synchronous
functions, `AsyncApi` awaits their async twins on one event loop that lives in a background
thread for the adapter's lifetime (as a FastAPI service's loop does), so the async clients a
memory creates on its first async call are reused by every later call and closed at the end.

A test written against `Api` runs the same calls through both doors (fixture `api` in
tests/api/conftest.py) and asserts the same outcomes of each.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from memory_core import (
    ConversationContext,
    RedisConversationMemory,
    SaveOutcome,
    aclose_connections,
    aenqueue_turn,
    asave_session_to_thread_safe,
    enqueue_turn,
    save_session_to_thread_safe,
)
from memory_core.io.redis_client import make_redis
from memory_core.settings import Settings, get_settings

T = TypeVar("T")
KINDS = ["sync", "async"]  # the `api` fixture's parameters
# The longest a single call may take before the adapter gives up on it (a hung core is a
# failure with a message, not a test killed by pytest-timeout).
CALL_TIMEOUT_S = 180.0
Snapshot = Mapping[str, Any] | Any


class Api(Protocol):
    """One door into memory_core: the same three calls, the same results."""

    kind: str

    def get_context(
        self, memory: RedisConversationMemory, thread_id: uuid.UUID | str, owner_id: str, **kw: Any
    ) -> ConversationContext: ...

    def save(
        self, snapshot: Snapshot, memory: RedisConversationMemory | None = None
    ) -> SaveOutcome: ...

    def enqueue(
        self,
        snapshot: Snapshot,
        memory: RedisConversationMemory | None = None,
        broker_url: str | None = None,
    ) -> SaveOutcome: ...

    def close(self) -> None: ...


class SyncApi:
    """The synchronous functions, called directly."""

    kind = "sync"

    def get_context(
        self, memory: RedisConversationMemory, thread_id: uuid.UUID | str, owner_id: str, **kw: Any
    ) -> ConversationContext:
        return memory.get_context(thread_id, owner_id, **kw)

    def save(
        self, snapshot: Snapshot, memory: RedisConversationMemory | None = None
    ) -> SaveOutcome:
        return save_session_to_thread_safe(snapshot, memory=memory)

    def enqueue(
        self,
        snapshot: Snapshot,
        memory: RedisConversationMemory | None = None,
        broker_url: str | None = None,
    ) -> SaveOutcome:
        return enqueue_turn(snapshot, memory=memory, broker_url=broker_url)

    def close(self) -> None:
        pass


class AsyncApi:
    """The async functions, awaited on one persistent event loop in a background thread.

    `close()` closes the async clients of every memory it was handed (`aclose`) and the
    process-wide pools of its loop (`aclose_connections`), then stops and closes the loop.
    """

    kind = "async"

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._memories: dict[int, RedisConversationMemory] = {}
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="async-api-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the adapter's loop from this (any other) thread."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        with self._lock:
            self._pending.add(future)
        try:
            return future.result(CALL_TIMEOUT_S)
        except TimeoutError:
            if future.done():  # the coroutine's own TimeoutError (TurnNotReady is one)
                raise
            future.cancel()
            raise AssertionError(f"an async call outlasted {CALL_TIMEOUT_S:g} s") from None
        finally:
            with self._lock:
                self._pending.discard(future)

    def _cancel_pending(self) -> None:
        """Cancel the calls still running (a test that failed while one waited) and let their
        tasks unwind on the loop, as a service's shutdown cancels its requests."""
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            future.cancel()
        concurrent.futures.wait(pending, timeout=30)

    def _track(self, memory: RedisConversationMemory | None) -> None:
        if memory is not None:
            self._memories[id(memory)] = memory

    def get_context(
        self, memory: RedisConversationMemory, thread_id: uuid.UUID | str, owner_id: str, **kw: Any
    ) -> ConversationContext:
        self._track(memory)
        return self.run(memory.aget_context(thread_id, owner_id, **kw))

    def save(
        self, snapshot: Snapshot, memory: RedisConversationMemory | None = None
    ) -> SaveOutcome:
        self._track(memory)
        return self.run(asave_session_to_thread_safe(snapshot, memory=memory))

    def enqueue(
        self,
        snapshot: Snapshot,
        memory: RedisConversationMemory | None = None,
        broker_url: str | None = None,
    ) -> SaveOutcome:
        self._track(memory)
        return self.run(aenqueue_turn(snapshot, memory=memory, broker_url=broker_url))

    async def _aclose(self) -> None:
        for memory in self._memories.values():
            await memory.aclose()
        self._memories.clear()
        await aclose_connections()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self._cancel_pending()
            self.run(self._aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(60)


def make_api(kind: str) -> Api:
    return SyncApi() if kind == "sync" else AsyncApi()


def memory_at(
    *,
    redis_url: str | None = None,
    database_url: str | None = None,
    settings: Mapping[str, Any] | None = None,
    **kw: Any,
) -> RedisConversationMemory:
    """A memory whose Redis and/or Postgres are elsewhere (e.g. a port where nothing listens):
    its settings and sync clients point there, and so do the async clients (created from the
    settings' URLs). `settings`: further settings values. The caller closes `memory.redis`
    (and disposes `memory.engine`) afterwards."""
    from sqlalchemy import create_engine

    base = get_settings()
    s = Settings(
        **{
            "redis_url": redis_url or base.redis_url,
            "database_url": database_url or base.database_url,
            "celery_broker_url": base.celery_broker_url,
            **(settings or {}),
        }
    )
    client = make_redis(redis_url) if redis_url else None
    engine = (
        create_engine(s.database_url, connect_args={"connect_timeout": 1}) if database_url else None
    )
    return RedisConversationMemory(client, settings=s, engine=engine, **kw)


# ---------------------------------------------------------------- what tests of both doors share

OWNER = "user-42"  # make_snapshot's


def new_thread(api: Api, memory: RedisConversationMemory, turns: int) -> uuid.UUID:
    """A thread of `turns` turns of OWNER, saved through `api` (each asserted saved, in order)."""
    from tests.support.snapshots import make_snapshot

    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        out = api.save(make_snapshot(tid, n), memory=memory)
        assert (out.status, out.seq) == ("saved", n), out
    return tid


def seqs(api: Api, memory: RedisConversationMemory, tid: uuid.UUID) -> list[int]:
    """The seqs of the turns OWNER's read through `api` serves."""
    return [e.seq for e in api.get_context(memory, tid, OWNER).recent]


def copy_members(memory: RedisConversationMemory, tid: uuid.UUID) -> list[bytes]:
    """The turns the thread's working copy holds (asserting there is a copy)."""
    meta, members = memory.copy.read(tid)
    assert meta, "working copy missing"
    return members
