"""The same behaviours through both doors (`api`: sync, async) while a server is away or
failing: Postgres unreachable or restarted, Redis unreachable, refusing writes, or holding a
copy that does not parse. Each outcome is the synchronous API's (tests/test_finalize.py,
tests/test_guarantees.py); the async door must match it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from memory_core import RedisConversationMemory, ThreadNotFound
from memory_core.devservices.ports import free_port
from memory_core.io.db import reset_engines
from memory_core.settings import get_settings
from tests.support.api import OWNER, Api, copy_members, memory_at, new_thread, seqs
from tests.support.faults import FaultyRedis, terminate_backends
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs, thread_row


@pytest.fixture
def live(fresh_faulty_redis: FaultyRedis) -> Iterator[RedisConversationMemory]:
    """A memory on the private Redis (sync and async clients), with its own key prefix."""
    memory = memory_at(redis_url=fresh_faulty_redis.url, key_prefix=f"p{uuid.uuid4().hex[:8]}")
    yield memory
    memory.redis.close()


def test_pooled_connections_killed_by_postgres_are_replaced(
    api: Api, memory: RedisConversationMemory
) -> None:
    """After a Postgres restart each pool (the async one too) holds dead connections: the
    next call still works."""
    tid = new_thread(api, memory, 1)
    memory.invalidate(tid)
    assert seqs(api, memory, tid) == [1]  # a read through the door's pool too
    # Both pools: the blocking one and the asyncio one (its own application_name).
    killed = sum(
        terminate_backends(get_settings().database_url, name)
        for name in ("agent-memory", "agent-memory-async")
    )
    assert killed >= 1
    out = api.save(make_snapshot(tid, 2), memory=memory)
    assert (out.status, out.seq) == ("saved", 2), out
    memory.invalidate(tid)
    assert seqs(api, memory, tid) == [1, 2]
    reset_engines()  # the other door's pool (this process's blocking one) is still dead


def test_postgres_unreachable_is_failed_retryable_and_nothing_written(api: Api) -> None:
    dead = memory_at(database_url=f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    tid = uuid.uuid4()
    try:
        out = api.save(make_snapshot(tid, 1), memory=dead)
    finally:
        dead.engine.dispose()
    assert (out.status, out.retryable, out.ok, out.seq) == ("failed", True, False, None), out
    assert out.reason is not None and out.reason.startswith("postgres: "), out.reason
    assert thread_row(tid) is None
    assert dead.copy.read(tid) == ({}, []), "nothing may reach the cache before Postgres commits"


def test_redis_unreachable_on_save_lands_and_the_next_read_serves_the_turn(
    api: Api, fresh_faulty_redis: FaultyRedis, live: RedisConversationMemory
) -> None:
    tid = new_thread(api, live, 3)
    fresh_faulty_redis.down()
    out = api.save(make_snapshot(tid, 4), memory=live)
    assert (out.status, out.seq, out.cache, out.ok) == ("saved", 4, "unavailable", True)
    assert stored_seqs(tid) == [1, 2, 3, 4]
    assert seqs(api, live, tid) == [1, 2, 3, 4]  # meanwhile: from Postgres
    fresh_faulty_redis.up()
    assert seqs(api, live, tid) == [1, 2, 3, 4]  # Redis is back: not its stale copy
    assert len(copy_members(live, tid)) == 4


def test_a_memory_given_sync_clients_only_reaches_the_same_servers_through_both_doors(
    api: Api, dead_redis: redis.Redis
) -> None:
    """The constructor as tests and services have always called it: `engine=` / a Redis
    client, nothing async. Each door must then talk to those servers, not others."""
    from sqlalchemy import create_engine

    dead_pg = create_engine(
        f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/x",
        connect_args={"connect_timeout": 1},
    )
    tid = uuid.uuid4()
    try:
        out = api.save(make_snapshot(tid, 1), memory=RedisConversationMemory(engine=dead_pg))
    finally:
        dead_pg.dispose()
    assert (out.status, out.retryable) == ("failed", True), out
    assert thread_row(tid) is None, "saved into another database than the memory's engine"
    out = api.save(make_snapshot(tid, 1), memory=RedisConversationMemory(dead_redis))
    assert (out.status, out.seq, out.cache) == ("saved", 1, "unavailable"), out


def test_a_corrupt_copy_is_served_from_postgres_and_rebuilt(
    api: Api, memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    tid = new_thread(api, memory, 3)
    expected = memory.rehydrate(tid, OWNER)
    redis_client.zadd(memory.copy.keys(tid)[1], {b"{not json": 3.5})
    assert api.get_context(memory, tid, OWNER) == expected  # read around it...
    assert b"{not json" not in memory.copy.read(tid)[1]  # ...and dropped it
    assert api.get_context(memory, tid, OWNER) == expected  # the next read rebuilds it
    members = copy_members(memory, tid)
    assert b"{not json" not in members and len(members) == 3
    assert api.get_context(memory, tid, OWNER) == expected  # and is served from it


def test_redis_down_on_read_is_served_from_postgres(
    api: Api, memory: RedisConversationMemory, offline: RedisConversationMemory
) -> None:
    tid = new_thread(api, memory, 3)
    assert api.get_context(offline, tid, OWNER) == memory.get_context(tid, OWNER)
    with pytest.raises(ThreadNotFound):
        api.get_context(offline, tid, "mallory")
    with pytest.raises(ThreadNotFound):
        api.get_context(offline, uuid.uuid4(), OWNER)


def _break(server: FaultyRedis, live: RedisConversationMemory, tid: uuid.UUID, fault: str) -> None:
    if fault == "wrong_type":  # another program wrote a string where the copy's hash lives
        server.admin.delete(*live.copy.keys(tid))
        server.admin.set(live.copy.keys(tid)[0], "not a hash")
    else:
        getattr(server, fault)()


@pytest.mark.parametrize("fault", ["full", "read_only", "wrong_type"])
def test_redis_error_replies_never_fail_a_save_or_a_read(
    api: Api, fresh_faulty_redis: FaultyRedis, live: RedisConversationMemory, fault: str
) -> None:
    tid = new_thread(api, live, 3)
    _break(fresh_faulty_redis, live, tid, fault)
    out = api.save(make_snapshot(tid, 4), memory=live)
    assert (out.status, out.seq, out.cache) == ("saved", 4, "unavailable"), out
    assert seqs(api, live, tid) == [1, 2, 3, 4]  # served from Postgres meanwhile
    with pytest.raises(ThreadNotFound):
        api.get_context(live, tid, "mallory")
    fresh_faulty_redis.up()
    assert seqs(api, live, tid) == [1, 2, 3, 4]
    assert len(copy_members(live, tid)) == 4, "the copy is rebuilt once Redis takes writes"
