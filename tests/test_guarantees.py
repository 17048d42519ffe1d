"""Guarantees that once did not hold, each against the public API and real servers.

Coverage after expiry, redelivery repairing the copy, never-raises under Redis errors other
than connection errors and under Postgres errors after the COMMIT, folds that never vanish,
the summary's bound, reused session ids, what a stranger's read ships, the whole-snapshot
bound. docs/RELIABILITY.md lists each with the test that holds it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import create_engine, select

from memory_core import (
    RedisConversationMemory,
    ThreadNotFound,
    render_conversation_context,
    save_session_to_thread_safe,
)
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.fold.folding import Folder
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.io.db import session_scope
from memory_core.io.redis_client import make_redis
from memory_core.models import ConversationThread, ThreadMessage
from memory_core.settings import Settings, get_settings
from memory_core.tokens import count_tokens
from tests.support.faults import FaultyRedis, postgres_role
from tests.support.snapshots import make_snapshot

OWNER = "user-42"


def _settings(llm: FakeLLMServer | None = None, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "langfuse_public_key": None,
        "langfuse_secret_key": None,
        "openai_base_url": llm.base_url if llm else None,
        "openai_api_key": "sk-test" if llm else None,
        "memory_llm_timeout_s": 2.0,
    }
    return Settings(_env_file=None, **values | extra)


@pytest.fixture
def live(fresh_faulty_redis: FaultyRedis) -> Iterator[RedisConversationMemory]:
    """A memory on the private Redis, with its own key prefix."""
    client = make_redis(fresh_faulty_redis.url)
    yield RedisConversationMemory(client, key_prefix=f"g{uuid.uuid4().hex[:8]}")
    client.close()


def _thread(memory: RedisConversationMemory, turns: int, **overrides: Any) -> uuid.UUID:
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        out = save_session_to_thread_safe(make_snapshot(tid, n, **overrides), memory=memory)
        assert out.status == "saved", out
    return tid


def _seqs(memory: RedisConversationMemory, tid: uuid.UUID) -> list[int]:
    return [e.seq for e in memory.get_context(tid, OWNER).recent]


def _row(tid: uuid.UUID) -> ConversationThread:
    with session_scope() as s:
        return s.scalars(select(ConversationThread).where(ConversationThread.id == tid)).one()


# ---------------------------------------------------------------- 1. coverage after expiry


def test_a_fold_never_creates_a_copy_that_lacks_the_turns(live: RedisConversationMemory) -> None:
    tid = _thread(live, 21)
    live.invalidate(tid)  # the copy expired (or Redis restarted) before the fold finished
    out = Folder(live, ConversationSummarizer(_settings())).fold(tid)
    assert (out.status, out.through_seq) == ("folded", 11)
    assert live.copy.read(tid) == ({}, []), "a fold must not create a copy"
    ctx = live.get_context(tid, OWNER)
    assert ctx.summary_through_seq == 11 and ctx.summary
    assert [e.seq for e in ctx.recent] == list(range(12, 22))


# ---------------------------------------------------------------- 2. redelivery repairs


def test_a_redelivered_finalize_puts_its_turn_into_the_copy(
    live: RedisConversationMemory, dead_redis: redis.Redis
) -> None:
    tid = _thread(live, 3)
    # The first delivery of turn 4 committed, then its process died before the cache write.
    crashed = RedisConversationMemory(dead_redis, key_prefix=live.key_prefix)
    snap = make_snapshot(tid, 4)
    first = save_session_to_thread_safe(snap, memory=crashed)
    assert (first.status, first.cache) == ("saved", "unavailable")
    assert _seqs(live, tid) == [1, 2, 3]  # the crash window
    again = save_session_to_thread_safe(snap, memory=live)
    assert (again.status, again.seq) == ("duplicate", 4)
    assert _seqs(live, tid) == [1, 2, 3, 4]


def test_a_redelivery_carries_what_was_stored_not_what_it_says(
    live: RedisConversationMemory,
) -> None:
    tid = _thread(live, 2)
    live.invalidate(tid)
    snap = make_snapshot(tid, 2)
    with session_scope() as s:
        stored = s.scalars(
            select(ThreadMessage.session_id).where(
                ThreadMessage.thread_id == tid, ThreadMessage.seq == 2
            )
        ).one()
    snap |= {"session_id": str(stored), "user_query": "a different text for the same turn"}
    assert save_session_to_thread_safe(snap, memory=live).status == "duplicate"
    assert live.get_context(tid, OWNER).recent[-1].user_query.startswith("Revenue by region")


# ---------------------------------------------------------------- 3. never raises


def _break(server: FaultyRedis, live: RedisConversationMemory, tid: uuid.UUID, fault: str) -> None:
    if fault == "wrong_type":  # another program wrote a string where the copy's hash lives
        server.admin.delete(*live.copy.keys(tid))
        server.admin.set(live.copy.keys(tid)[0], "not a hash")
    else:
        getattr(server, fault)()


@pytest.mark.parametrize("fault", ["full", "read_only", "wrong_type"])
def test_redis_error_replies_never_fail_a_save_or_a_read(
    fresh_faulty_redis: FaultyRedis, live: RedisConversationMemory, fault: str
) -> None:
    tid = _thread(live, 3)
    _break(fresh_faulty_redis, live, tid, fault)
    out = save_session_to_thread_safe(make_snapshot(tid, 4), memory=live)
    assert (out.status, out.seq, out.cache) == ("saved", 4, "unavailable")
    assert _seqs(live, tid) == [1, 2, 3, 4]  # served from Postgres meanwhile
    with pytest.raises(ThreadNotFound):
        live.get_context(tid, "mallory")
    fresh_faulty_redis.up()
    assert _seqs(live, tid) == [1, 2, 3, 4]
    meta, _ = live.copy.read(tid)
    assert meta, "the copy is rebuilt once Redis takes writes again"


def test_a_copy_that_does_not_parse_is_read_around_and_rebuilt(
    fresh_faulty_redis: FaultyRedis, live: RedisConversationMemory
) -> None:
    tid = _thread(live, 3)
    fresh_faulty_redis.admin.zadd(live.copy.keys(tid)[1], {b"{not json": 3.5})
    assert _seqs(live, tid) == [1, 2, 3]
    assert b"{not json" not in live.copy.read(tid)[1]


def test_every_key_keeps_a_ttl_when_a_write_fails_half_way(
    fresh_faulty_redis: FaultyRedis, live: RedisConversationMemory
) -> None:
    tid = _thread(live, 2)
    fresh_faulty_redis.full()
    save_session_to_thread_safe(make_snapshot(tid, 3), memory=live)
    fresh_faulty_redis.up()
    for key in fresh_faulty_redis.admin.scan_iter(f"{live.key_prefix}:*"):
        assert fresh_faulty_redis.admin.pttl(key) > 0, key


@pytest.fixture
def no_select_role() -> Iterator[str]:
    """A role that may write turns but not read their text back (a revoked grant)."""
    grants = [
        "SELECT, INSERT, UPDATE ON conversation_threads",
        "INSERT ON thread_messages",
        "SELECT (id, thread_id, seq, session_id) ON thread_messages",
    ]
    with postgres_role(get_settings().database_url, grants) as (url, _):
        yield url


def test_a_postgres_error_in_the_rebuild_after_commit_is_not_raised(
    live: RedisConversationMemory, no_select_role: str
) -> None:
    tid = _thread(live, 2)
    live.invalidate(tid)  # the next save must rebuild the copy from Postgres...
    engine = create_engine(no_select_role)
    limited = RedisConversationMemory(live.redis, key_prefix=live.key_prefix, engine=engine)
    out = save_session_to_thread_safe(make_snapshot(tid, 3), memory=limited)
    engine.dispose()
    # ...which this role may not read: the turn is committed all the same.
    assert (out.status, out.seq, out.cache) == ("saved", 3, "unavailable")
    assert _seqs(live, tid) == [1, 2, 3]


def test_a_memory_that_cannot_be_built_is_a_failed_save(monkeypatch: pytest.MonkeyPatch) -> None:
    from memory_core.settings import reset_settings_cache

    monkeypatch.setenv("REDIS_URL", "notredis://nowhere")
    reset_settings_cache()
    try:
        out = save_session_to_thread_safe(make_snapshot(uuid.uuid4(), 1))
    finally:
        monkeypatch.undo()
        reset_settings_cache()
    assert out.status == "failed" and out.retryable, out


# ---------------------------------------------------------------- 4. folds never vanish


@pytest.mark.parametrize(("mode", "bad"), [("nul", "\x00"), ("surrogate", "\ud800")])
def test_a_summary_postgres_cannot_store_is_cleaned_not_dropped(
    live: RedisConversationMemory, mode: str, bad: str
) -> None:
    with FakeLLMServer(mode=mode) as llm:
        tid = _thread(live, 21)
        out = Folder(live, ConversationSummarizer(_settings(llm))).fold(tid)
    assert (out.status, out.through_seq) == ("folded", 11), out
    row = _row(tid)
    assert row.summary and bad not in row.summary and "Running summary" in row.summary
    assert row.fold_lease_token is None


class _Exploding:
    """A summarizer whose failure is not a SummarizationError (a bug, an odd library)."""

    def summarize(self, **_: Any) -> Any:
        raise RuntimeError("unexpected")


def test_an_unexpected_error_in_a_fold_is_a_counted_attempt(live: RedisConversationMemory) -> None:
    tid = _thread(live, 21)
    out = Folder(live, _Exploding()).fold(tid)
    assert (out.status, out.attempt, out.retry_in_s) == ("failed", 1, 60)
    assert out.error and out.error.startswith("RuntimeError at ")
    row = _row(tid)
    assert (row.fold_attempts, row.fold_lease_token) == (1, None)
    assert row.fold_due_at is not None


# ---------------------------------------------------------------- 5. the summary's bound


def test_the_stored_summary_has_a_bound_and_views_keep_the_newest_turn(
    live: RedisConversationMemory,
) -> None:
    huge = [f"SELECT {i} AS c, '{'x' * 40_000}' AS pad FROM sales" for i in range(20)]
    tid = _thread(live, 21, sql=huge)
    out = Folder(live, ConversationSummarizer(_settings())).fold(tid)
    assert out.status == "folded"
    from memory_core.fold.summary_tail import stored_summary_bound

    s = get_settings().memory_summary_max_tokens
    stored = _row(tid).summary or ""
    assert count_tokens(stored) <= stored_summary_bound(s) <= s + s // 2 + 20
    assert "[... SQL truncated]" in stored
    ctx = live.get_context(tid, OWNER)
    view = render_conversation_context(ctx, "brief", 2000)
    assert "[#21] User:" in view and view.startswith("Conversation summary:")


# ---------------------------------------------------------------- 8. reused session ids


def test_a_session_id_reused_on_another_thread_is_rejected(live: RedisConversationMemory) -> None:
    first = _thread(live, 2)
    with session_scope() as s:
        sid = s.scalars(select(ThreadMessage.session_id).where(ThreadMessage.thread_id == first))
        reused = str(next(iter(sid)))
    other = uuid.uuid4()
    out = save_session_to_thread_safe(make_snapshot(other, 1, session_id=reused), memory=live)
    assert out.status == "rejected" and not out.retryable
    assert out.reason == f"session {reused} is already a turn of another thread"
    with session_scope() as s:
        assert s.get(ConversationThread, other) is None
    assert _seqs(live, first) == [1, 2]


# ---------------------------------------------------------------- 9. a stranger's read


def _output_bytes(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def test_a_strangers_read_ships_nothing_of_the_copy(
    fresh_faulty_redis: FaultyRedis, live: RedisConversationMemory
) -> None:
    tid = _thread(live, 12, answer="EMEA leads. " * 2000)  # a ~300 KB copy
    admin = fresh_faulty_redis.admin
    baseline = -_output_bytes(admin) + _output_bytes(admin)
    before = _output_bytes(admin)
    with pytest.raises(ThreadNotFound):
        live.get_context(tid, "mallory")
    stranger = _output_bytes(admin) - before - baseline
    before = _output_bytes(admin)
    live.get_context(tid, OWNER)
    owner = _output_bytes(admin) - before - baseline
    assert owner > 200_000
    assert stranger < 200, stranger


# ---------------------------------------------------------------- 11. the whole snapshot


def test_a_huge_snapshot_is_refused_before_deep_validation(live: RedisConversationMemory) -> None:
    options = {"columnMapping": {"region": "x"}, "blob": "o" * (1024 * 1024 - 64)}
    vizzes = [{"id": i, "type": "CHART", "name": "big", "options": options} for i in range(50)]
    # Also invalid in another field: the total bound is checked first, cheaply.
    snap = make_snapshot(uuid.uuid4(), 1, visualizations=vizzes, agent_type="robot")
    out = save_session_to_thread_safe(snap, memory=live)
    assert out.status == "rejected" and not out.retryable
    assert out.reason and "characters of text in all" in out.reason
    assert "agent_type" not in out.reason


# ---------------------------------------------------------------- also settled


def test_a_fold_only_worker_drops_the_copies_it_marked(
    fresh_faulty_redis: FaultyRedis, live: RedisConversationMemory
) -> None:
    tid, other = _thread(live, 21), _thread(live, 3)
    folder = Folder(live, ConversationSummarizer(_settings()))
    fresh_faulty_redis.read_only()  # the refresh after the fold fails: the copy is marked
    assert folder.fold(tid).status == "folded"
    fresh_faulty_redis.up()
    # This process only folds (no read, no save): its next fold drops the marked copy.
    assert folder.fold(other).status == "noop"
    assert live.copy.read(tid) == ({}, [])
    ctx = live.get_context(tid, OWNER)
    assert ctx.summary_through_seq == 11 and [e.seq for e in ctx.recent] == list(range(12, 22))


def _fold_gauges() -> dict[str, float]:
    from memory_core.metrics import FoldLagCollector

    collector = FoldLagCollector(get_settings().database_url, 20, ttl_s=0)
    return {m.name: m.samples[0].value for m in collector.collect()}


def test_fold_lag_gauges_count_threads_with_a_fold_due(live: RedisConversationMemory) -> None:
    before = _fold_gauges()
    tid = _thread(live, 21)  # over the threshold: a fold is due
    after = _fold_gauges()
    assert after["memory_fold_lag_threads"] == before["memory_fold_lag_threads"] + 1
    assert after["memory_fold_oldest_due_seconds"] >= 0
    Folder(live, ConversationSummarizer(_settings())).fold(tid)
    assert _fold_gauges()["memory_fold_lag_threads"] == before["memory_fold_lag_threads"]


def test_fold_retry_gauges_show_a_failed_fold_waiting_for_its_retry(
    live: RedisConversationMemory,
) -> None:
    tid = _thread(live, 21)
    before = _fold_gauges()
    assert Folder(live, _Exploding()).fold(tid).retry_in_s == 60  # due again in 60 s
    failed_at = time.time()
    after = _fold_gauges()
    waiting = "memory_fold_retry_waiting_threads"
    assert after[waiting] == before[waiting] + 1
    next_due = after["memory_fold_retry_next_due_timestamp_seconds"]
    assert 0 < next_due <= failed_at + 61  # this retry, or an earlier one of another test
    Folder(live, ConversationSummarizer(_settings())).fold(tid)  # the retry succeeds
    assert _fold_gauges()[waiting] == before[waiting]


def test_processes_that_disagree_on_settings_notice(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from memory_core.copy import settings_check

    prefix = f"disagree{uuid.uuid4().hex[:6]}"
    agent = RedisConversationMemory(redis_client, key_prefix=prefix)
    worker = RedisConversationMemory(redis_client, key_prefix=prefix, compression_threshold=30)
    settings_check.check(agent, settings_check.fingerprint(agent))  # the agent was here first
    with caplog.at_level(logging.WARNING, logger="memory_core"):
        others = settings_check.check(worker, settings_check.fingerprint(worker))
    assert settings_check.fingerprint(agent) in others
    assert any("memory.settings_disagree" in r.getMessage() for r in caplog.records)
    assert "compression_threshold=30" in settings_check.fingerprint(worker)
