"""Deletion is all or nothing when Redis or Postgres fails, and a retry finishes it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine, create_engine, text

from memory_core import (
    RedisConversationMemory,
)
from memory_core.copy.context import ConversationContext
from memory_core.devservices.ports import free_port
from memory_core.io.db import get_engine
from memory_core.io.redis_client import make_redis
from memory_core.lifecycle.threads import (
    DeleteFailed,
    delete_thread,
)
from memory_core.settings import get_settings
from tests.support.faults import FaultyRedis, engine_with_lock_timeout
from tests.support.lifecycle import (
    copy_keys,
    gone_key,
    has_tombstone,
    new_thread,
    not_found,
    save,
    seqs,
    thread_exists,
    turn_count,
)

# ------------------------------------------------------------------ failures during a delete


@pytest.fixture
def live(fresh_faulty_redis: FaultyRedis) -> Iterator[RedisConversationMemory]:
    """A memory on the private Redis the test may stop, fill or demote."""
    client = make_redis(fresh_faulty_redis.url)
    yield RedisConversationMemory(client)
    client.close()


@pytest.mark.parametrize("fault", ["down", "read_only"])
def test_redis_failing_during_a_delete_deletes_nothing_and_a_retry_succeeds(
    fresh_faulty_redis: FaultyRedis, live: RedisConversationMemory, owner: str, fault: str
) -> None:
    tid = new_thread(live, owner, 3)
    getattr(fresh_faulty_redis, fault)()

    with pytest.raises(DeleteFailed, match="nothing was deleted: Redis failed"):
        delete_thread(tid, owner, memory=live)

    assert thread_exists(tid) and turn_count(tid) == 3 and not has_tombstone(tid)
    assert seqs(live, tid, owner) == [1, 2, 3]  # still readable (from Postgres if need be)
    fresh_faulty_redis.up()
    assert seqs(live, tid, owner) == [1, 2, 3]
    out = save(live, tid, owner, 4)  # still a thread like any other
    assert (out.status, out.seq) == ("saved", 4)

    report = delete_thread(tid, owner, memory=live)

    assert (report.threads, report.turns) == (1, 4)
    assert not thread_exists(tid) and turn_count(tid) == 0 and has_tombstone(tid)
    assert copy_keys(live, tid) == []
    not_found(lambda: live.get_context(tid, owner), tid)


def test_a_full_redis_does_not_stop_a_delete(
    fresh_faulty_redis: FaultyRedis, live: RedisConversationMemory, owner: str
) -> None:
    """Out of memory (noeviction), Redis still deletes: the copy goes and the marker is set."""
    tid = new_thread(live, owner, 3)
    fresh_faulty_redis.full()

    report = delete_thread(tid, owner, memory=live)

    assert (report.threads, report.turns, report.copies) == (1, 3, 1)
    assert not thread_exists(tid) and turn_count(tid) == 0 and has_tombstone(tid)
    assert copy_keys(live, tid) == []
    assert 0 < live.redis.pttl(gone_key(live, tid)) <= live.copy.ttl_ms
    fresh_faulty_redis.up()
    late = ConversationContext(thread_id=tid, recent=[])
    assert live.copy.merge(owner, late, 3) == "gone"
    assert copy_keys(live, tid) == []
    not_found(lambda: live.get_context(tid, owner), tid)


@pytest.fixture
def impatient_engine() -> Iterator[Engine]:
    """An engine whose statements give up on a lock after 300 ms."""
    engine = engine_with_lock_timeout(get_settings().database_url, "lifecycle-test", 300)
    yield engine
    engine.dispose()


def test_postgres_failing_after_the_redis_step_lifts_the_marker(
    redis_client: redis.Redis, impatient_engine: Engine, owner: str
) -> None:
    mem = RedisConversationMemory(redis_client, engine=impatient_engine)
    tid = new_thread(mem, owner, 3)
    # Another transaction holds a lock on one of the thread's turns: the delete locks the
    # thread row, deletes the copy and sets the marker, then its DELETE of the turns waits
    # for that lock and gives up (lock_timeout): the transaction rolls back.
    blocker = get_engine().connect()
    try:
        blocker.begin()
        blocker.execute(
            text("SELECT id FROM thread_messages WHERE thread_id = :t AND seq = 2 FOR UPDATE"),
            {"t": tid},
        ).one()
        with pytest.raises(DeleteFailed, match="Postgres failed") as caught:
            delete_thread(tid, owner, memory=mem)
        assert "55P03" in str(caught.value)  # lock_not_available
    finally:
        blocker.rollback()
        blocker.close()

    assert thread_exists(tid) and turn_count(tid) == 3 and not has_tombstone(tid)
    assert not mem.redis.exists(gone_key(mem, tid)), "the marker outlived a rolled-back delete"
    # Copy writes work again: a read rebuilds the copy, a save goes into it.
    assert copy_keys(mem, tid) == []
    assert seqs(mem, tid, owner) == [1, 2, 3]
    assert len(copy_keys(mem, tid)) == 2
    out = save(mem, tid, owner, 4)
    assert (out.status, out.seq, out.cache) == ("saved", 4, "ok")
    meta, members = mem.copy.read(tid)
    assert int(meta[b"last"]) == 4 and len(members) == 4
    # And the delete, retried without the lock, goes through.
    assert delete_thread(tid, owner, memory=mem).turns == 4


def test_postgres_unreachable_during_a_delete_is_delete_failed(
    redis_client: redis.Redis, owner: str
) -> None:
    engine = create_engine(
        f"postgresql://postgres@127.0.0.1:{free_port()}/none", connect_args={"connect_timeout": 2}
    )
    try:
        down = RedisConversationMemory(redis_client, engine=engine)
        with pytest.raises(DeleteFailed, match="Postgres failed"):
            delete_thread(uuid.uuid4(), owner, memory=down)
    finally:
        engine.dispose()
