"""save_session_to_thread_safe on real Postgres + Redis: exactly once per turn, seq in order
without gaps, Postgres before any cache write, owner only, artifacts derived once at finalize."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from sqlalchemy import func, select

from memory_core import ConversationContext, RedisConversationMemory, save_session_to_thread_safe
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread, ThreadMessage
from tests.support.snapshots import make_snapshot


def _rows(thread_id: uuid.UUID) -> list[ThreadMessage]:
    with session_scope() as s:
        return list(
            s.scalars(
                select(ThreadMessage).where(ThreadMessage.thread_id == thread_id).order_by("seq")
            )
        )


def _cached_seqs(memory: RedisConversationMemory, thread_id: uuid.UUID) -> list[int]:
    meta, members = memory.copy.read(thread_id)
    assert meta, "working copy missing"
    return [
        ConversationContext.model_validate_json(
            b'{"thread_id":"%s","recent":[%s]}' % (str(thread_id).encode(), b",".join(members))
        )
        .recent[i]
        .seq
        for i in range(len(members))
    ]


def test_first_turn_creates_thread_titled_by_query(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    out = save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory)
    assert (out.status, out.seq, out.cache) == ("saved", 1, "ok")
    with session_scope() as s:
        thread = ConversationThread.get_owned(s, tid, "user-42")
    assert thread.title == "Revenue by region for 2001, excluding returns (turn 1)"
    assert (thread.agent_type, thread.last_seq, thread.summary_through_seq) == ("chat", 1, 0)
    save_session_to_thread_safe(
        make_snapshot(tid, 2, user_query="a different query"), memory=memory
    )
    with session_scope() as s:
        assert ConversationThread.get_owned(s, tid, "user-42").title.startswith("Revenue by region")


def test_artifacts_are_derived_once_and_stored_compact(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    snap = make_snapshot(tid, 1)
    save_session_to_thread_safe(snap, memory=memory)
    (row,) = _rows(tid)
    assert row.artifacts == [
        {"kind": "sql", "sql": snap["sql"][0]},
        {
            "kind": "visualization",
            "id": 101,
            "type": "CHART",
            "name": "Revenue by region 1",
            "chart": "column",
            "x": ["region"],
            "y": ["revenue"],
            "series": [],
        },
        {
            "kind": "dashboard",
            "id": 3,
            "name": "Sales",
            "widget_count": 1,
            "visualization_ids": [101],
        },
    ]
    assert "options" not in str(row.artifacts) and "#ff0000" not in str(row.artifacts)
    assert row.response_payload == snap["response_payload"]
    # The working copy carries exactly the stored artifacts, not a re-derivation.
    ctx = memory.get_context(tid, "user-42")
    assert [a.model_dump(mode="json") for a in ctx.recent[0].artifacts] == row.artifacts


def test_redelivered_snapshot_lands_once(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    snap = make_snapshot(tid, 1)
    outcomes = [save_session_to_thread_safe(snap, memory=memory) for _ in range(5)]
    assert [o.status for o in outcomes] == ["saved"] + ["duplicate"] * 4
    second = save_session_to_thread_safe(make_snapshot(tid, 2), memory=memory)
    assert second.seq == 2, "a duplicate must not burn a seq"
    assert [r.seq for r in _rows(tid)] == [1, 2]
    assert _cached_seqs(memory, tid) == [1, 2]


def test_same_snapshot_saved_concurrently_lands_once(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory)
    snap = make_snapshot(tid, 2)
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(
            pool.map(lambda _: save_session_to_thread_safe(snap, memory=memory), range(32))
        )
    statuses = sorted(o.status for o in outcomes)
    assert statuses.count("saved") == 1 and statuses.count("duplicate") == 31
    assert [r.seq for r in _rows(tid)] == [1, 2]
    assert _cached_seqs(memory, tid) == [1, 2]


def test_concurrent_distinct_turns_get_gapless_seq(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    snaps = [make_snapshot(tid, n) for n in range(1, 31)]
    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(lambda s: save_session_to_thread_safe(s, memory=memory), snaps))
    assert all(o.status == "saved" for o in outcomes)
    rows = _rows(tid)
    assert [r.seq for r in rows] == list(range(1, 31))
    assert len({r.session_id for r in rows}) == 30
    # The working copy converges on exactly the committed turns, in seq order (cap is 40).
    ctx = memory.get_context(tid, "user-42")
    assert [e.seq for e in ctx.recent] == list(range(1, 31))
    assert [e.session_id for e in ctx.recent] == [r.session_id for r in rows]


def test_invalid_snapshot_is_rejected_before_any_write(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    out = save_session_to_thread_safe(
        make_snapshot(tid, 1, agent_type="robot", user_query="x" * 9000), memory=memory
    )
    assert out.status == "rejected" and not out.retryable
    assert out.reason is not None
    assert "agent_type" in out.reason and "user_query" in out.reason
    with session_scope() as s:
        assert s.scalar(select(func.count()).where(ConversationThread.id == tid)) == 0
    assert not memory.copy.read(tid)[0]


def test_stranger_cannot_write_into_a_thread(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory)
    out = save_session_to_thread_safe(make_snapshot(tid, 2, owner_id="mallory"), memory=memory)
    assert out.status == "rejected" and out.reason == f"thread {tid} not found"
    assert [r.seq for r in _rows(tid)] == [1]


def test_postgres_down_reports_failed_not_saved(redis_client: redis.Redis) -> None:
    from sqlalchemy import create_engine

    dead = create_engine(
        "postgresql+psycopg2://postgres@127.0.0.1:1/x", connect_args={"connect_timeout": 1}
    )
    memory = RedisConversationMemory(redis_client, engine=dead)
    tid = uuid.uuid4()
    out = save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory)
    assert out.status == "failed" and out.retryable
    assert out.reason is not None and "postgres" in out.reason
    assert not memory.copy.read(tid)[0], "nothing may reach the cache before Postgres commits"


def test_redis_down_save_still_lands_and_next_save_repairs_copy(
    memory: RedisConversationMemory, dead_redis: redis.Redis
) -> None:
    tid = uuid.uuid4()
    for n in (1, 2, 3):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    offline = RedisConversationMemory(dead_redis)
    out = save_session_to_thread_safe(make_snapshot(tid, 4), memory=offline)
    assert (out.status, out.seq, out.cache) == ("saved", 4, "unavailable")
    # Reads fall back to Postgres while Redis is down.
    assert [e.seq for e in offline.get_context(tid, "user-42").recent] == [1, 2, 3, 4]
    # The live copy missed turn 4; the next save notices the gap and rebuilds it.
    assert _cached_seqs(memory, tid) == [1, 2, 3]
    out = save_session_to_thread_safe(make_snapshot(tid, 5), memory=memory)
    assert out.cache == "rebuilt"
    assert _cached_seqs(memory, tid) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("ttl_hours", [1, 24])
def test_every_key_has_a_ttl(redis_client: redis.Redis, ttl_hours: float) -> None:
    memory = RedisConversationMemory(redis_client, ttl_hours=ttl_hours)
    tid = uuid.uuid4()
    save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory)
    keys = redis_client.keys(f"chat_conversation:{{{tid}}}*")
    assert len(keys) == 2
    for key in keys:
        ttl = redis_client.pttl(key)
        assert 0 < ttl <= ttl_hours * 3_600_000


def test_pooled_connections_killed_by_postgres_are_replaced(
    memory: RedisConversationMemory,
) -> None:
    """After a Postgres restart the pool holds dead connections: the next call still works."""
    from sqlalchemy import create_engine, text

    tid = uuid.uuid4()
    assert save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory).ok
    admin = create_engine(memory.engine.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        killed = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND application_name = 'agent-memory'"
            )
        ).scalar()
    admin.dispose()
    assert killed and killed >= 1
    out = save_session_to_thread_safe(make_snapshot(tid, 2), memory=memory)
    assert (out.status, out.seq) == ("saved", 2)
    memory.invalidate(tid)
    assert [e.seq for e in memory.get_context(tid, "user-42").recent] == [1, 2]


def test_publish_goes_to_the_broker_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery lets CELERY_BROKER_URL override `broker=`: publishing must not follow it."""
    import redis

    from memory_core.fold.publisher import publish_fold
    from memory_core.settings import get_settings

    target = get_settings().celery_broker_url
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")  # a dead broker
    broker = redis.Redis.from_url(target)
    before = broker.llen("memory.fold")
    assert publish_fold(uuid.uuid4(), broker_url=target)
    assert broker.llen("memory.fold") == before + 1
    assert not publish_fold(uuid.uuid4(), broker_url="redis://127.0.0.1:1/0")


def test_a_fold_that_cannot_be_published_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Never silent: a log record and a metric; the row keeps the fold due (test_folding.py
    covers the republish after the grace)."""
    import logging

    from memory_core.fold.publisher import publish_fold
    from memory_core.metrics import FOLD_PUBLISH_FAILURES

    before = FOLD_PUBLISH_FAILURES._value.get()
    with caplog.at_level(logging.WARNING, logger="memory_core"):
        assert not publish_fold(uuid.uuid4(), broker_url="redis://127.0.0.1:1/0")
    assert FOLD_PUBLISH_FAILURES._value.get() == before + 1
    assert any("memory.fold_publish_failed" in r.getMessage() for r in caplog.records)
