"""RedisConversationMemory.get_context: hits, misses, rehydration, owner checks, the cap."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from sqlalchemy import update

from memory_core import RedisConversationMemory, ThreadNotFound, save_session_to_thread_safe
from memory_core.io.db import session_scope
from memory_core.io.redis_client import make_redis
from memory_core.models import ConversationThread
from tests.support.faults import FaultyRedis
from tests.support.snapshots import make_snapshot


def _thread(memory: RedisConversationMemory, turns: int, owner: str = "user-42") -> uuid.UUID:
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        assert save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=memory).ok
    return tid


def _set_summary(tid: uuid.UUID, summary: str, through: int) -> None:
    with session_scope() as s:
        s.execute(
            update(ConversationThread)
            .where(ConversationThread.id == tid)
            .values(summary=summary, summary_through_seq=through)
        )


def test_hit_is_one_round_trip_and_equals_rehydration(fresh_faulty_redis: FaultyRedis) -> None:
    # A private Redis: its command count is this test's alone (other xdist workers share the
    # session's server).
    redis_client = make_redis(fresh_faulty_redis.url)
    memory = RedisConversationMemory(redis_client)
    tid = _thread(memory, 12)
    memory.get_context(_thread(memory, 1), "user-42")  # the read script is loaded on a server once
    before = redis_client.info("stats")["total_commands_processed"]
    hit = memory.get_context(tid, "user-42")
    after = redis_client.info("stats")["total_commands_processed"]
    # One EVALSHA of the read script, its HMGET and ZRANGE, and the first INFO: one round trip.
    assert after - before == 4
    memory.invalidate(tid)
    miss = memory.get_context(tid, "user-42")
    assert miss == hit
    assert miss.model_dump_json() == hit.model_dump_json()
    assert [e.seq for e in hit.recent] == list(range(1, 13))
    # The miss repopulated the copy, and the copy again equals what Postgres holds.
    assert memory.copy.read(tid)[0]
    assert memory.get_context(tid, "user-42") == hit
    redis_client.close()


def test_rehydrated_context_has_stored_summary_and_only_unfolded_turns(
    memory: RedisConversationMemory,
) -> None:
    tid = _thread(memory, 15)
    _set_summary(tid, "Goal: revenue by region, returns excluded.", through=5)
    memory.invalidate(tid)
    ctx = memory.get_context(tid, "user-42")
    assert ctx.summary == "Goal: revenue by region, returns excluded."
    assert ctx.summary_through_seq == 5
    assert [e.seq for e in ctx.recent] == list(range(6, 16))
    # The next save carries the new cursor into the copy: coverage holds (every turn is
    # either covered by the summary or verbatim in the copy).
    save_session_to_thread_safe(make_snapshot(tid, 16), memory=memory)
    ctx2 = memory.get_context(tid, "user-42")
    assert ctx2.summary_through_seq == 5 and [e.seq for e in ctx2.recent] == list(range(6, 17))


def test_newer_summary_in_postgres_refreshes_a_stale_copy_on_next_save(
    memory: RedisConversationMemory,
) -> None:
    tid = _thread(memory, 12)
    _set_summary(tid, "folded 1..4", through=4)  # a fold whose Redis refresh was lost
    out = save_session_to_thread_safe(make_snapshot(tid, 13), memory=memory)
    assert out.cache == "rebuilt"
    ctx = memory.get_context(tid, "user-42")
    assert (ctx.summary, ctx.summary_through_seq) == ("folded 1..4", 4)
    assert [e.seq for e in ctx.recent] == list(range(5, 14))


def test_stranger_and_unknown_get_the_same_error(memory: RedisConversationMemory) -> None:
    tid = _thread(memory, 2)
    unknown = uuid.uuid4()
    with pytest.raises(ThreadNotFound) as stranger_hit:
        memory.get_context(tid, "mallory")
    memory.invalidate(tid)
    with pytest.raises(ThreadNotFound) as stranger_miss:
        memory.get_context(tid, "mallory")
    with pytest.raises(ThreadNotFound) as missing:
        memory.get_context(unknown, "mallory")
    with pytest.raises(ThreadNotFound):
        memory.get_context("not-a-uuid", "mallory")
    assert str(stranger_hit.value) == str(stranger_miss.value) == f"thread {tid} not found"
    assert str(missing.value) == f"thread {unknown} not found"
    # A stranger's miss must not have created a copy under their name.
    assert memory.get_context(tid, "user-42").recent[-1].seq == 2


def test_redis_down_reads_postgres(
    memory: RedisConversationMemory, dead_redis: redis.Redis
) -> None:
    tid = _thread(memory, 3)
    offline = RedisConversationMemory(dead_redis)
    assert offline.get_context(tid, "user-42") == memory.get_context(tid, "user-42")
    with pytest.raises(ThreadNotFound):
        offline.get_context(tid, "mallory")


def test_unfolded_turns_are_capped_while_folding_fails(redis_client: redis.Redis) -> None:
    memory = RedisConversationMemory(redis_client)
    assert memory.max_unfolded_messages == 40  # documented: 2 x compression_threshold
    tid = _thread(memory, 47)  # no fold worker runs here: nothing gets folded
    ctx = memory.get_context(tid, "user-42")
    assert ctx.summary is None and ctx.summary_through_seq == 0
    assert [e.seq for e in ctx.recent] == list(range(8, 48))
    memory.invalidate(tid)
    assert memory.get_context(tid, "user-42") == ctx


def test_constructor_arguments_override_settings(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_core.settings import Settings

    monkeypatch.setenv("MEMORY_TTL_HOURS", "2")
    monkeypatch.setenv("MEMORY_KEY_PREFIX", "chat_conversation:ops")
    s = Settings()
    m = RedisConversationMemory(redis_client, settings=s)
    assert (m.ttl_hours, m.key_prefix, m.compression_threshold) == (2, "chat_conversation:ops", 20)
    m2 = RedisConversationMemory(
        redis_client, settings=s, ttl_hours=5, compression_threshold=30, max_recent_messages=12
    )
    assert (m2.ttl_hours, m2.compression_threshold, m2.max_unfolded_messages) == (5, 30, 60)
    with pytest.raises(ValueError, match="at least 2 x"):
        RedisConversationMemory(redis_client, max_unfolded_messages=10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_recent_messages": 20}, "max_recent_messages must be below"),
        ({"fold_token_trigger": -1}, "fold_token_trigger must be 0"),
        ({"ttl_hours": 0}, "ttl_hours must be a positive"),
        ({"ttl_hours": float("nan")}, "ttl_hours must be a positive"),
        ({"ttl_hours": 876_001}, "ttl_hours must be a positive"),
    ],
)
def test_constructor_refuses_limits_that_cannot_work(
    redis_client: redis.Redis, kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RedisConversationMemory(redis_client, **kwargs)  # type: ignore[arg-type]


def test_parsed_context_cache_never_serves_a_changed_copy(redis_client: redis.Redis) -> None:
    reader = RedisConversationMemory(redis_client)  # e.g. an agent API process
    writer = RedisConversationMemory(redis_client, local_cache_size=0)  # e.g. a worker
    tid = _thread(writer, 3)
    first = reader.get_context(tid, "user-42")
    assert reader.get_context(tid, "user-42") is first  # unchanged copy: the parsed object
    save_session_to_thread_safe(make_snapshot(tid, 4), memory=writer)
    second = reader.get_context(tid, "user-42")
    assert [e.seq for e in second.recent] == [1, 2, 3, 4]
    # A copy that expired and was rebuilt gets a fresh random version, never an old one.
    writer.invalidate(tid)
    _set_summary(tid, "rebuilt with a summary", through=2)
    writer.get_context(tid, "user-42")
    third = reader.get_context(tid, "user-42")
    assert third.summary == "rebuilt with a summary" and [e.seq for e in third.recent] == [3, 4]
    with pytest.raises(ThreadNotFound):
        reader.get_context(tid, "mallory")


def test_a_server_that_lost_its_scripts_is_served_through_the_fallback(
    memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    """The drivers call EVALSHA themselves; a restarted or flushed server answers NOSCRIPT,
    and the script is loaded and run: saves keep their copy, reads keep coming from it."""
    from memory_core import asave_session_to_thread_safe
    from memory_core.io.aio import aclose_connections

    tid, owner = uuid.uuid4(), "noscript-owner"
    assert save_session_to_thread_safe(make_snapshot(tid, 1, owner_id=owner), memory=memory).ok
    for n in (2, 3):
        redis_client.script_flush()
        out = save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=memory)
        assert (out.status, out.cache) == ("saved", "ok")  # the write script ran: copy kept
    redis_client.script_flush()
    fresh = RedisConversationMemory(redis_client, local_cache_size=0)  # reads the copy anew
    assert [t.seq for t in fresh.get_context(tid, owner).recent] == [1, 2, 3]

    async def asynchronously() -> list[int]:
        try:
            redis_client.script_flush()
            out = await asave_session_to_thread_safe(
                make_snapshot(tid, 4, owner_id=owner), memory=memory
            )
            assert (out.status, out.cache) == ("saved", "ok")
            redis_client.script_flush()
            ctx = await fresh.aget_context(tid, owner)
            return [t.seq for t in ctx.recent]
        finally:
            await aclose_connections()

    assert asyncio.run(asynchronously()) == [1, 2, 3, 4]
