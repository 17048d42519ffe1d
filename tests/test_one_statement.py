"""The finalize's one statement (claim.finalize_statement through fast_write) and the copy's
one-document read: fewer round trips, the same guarantees."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
import redis
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.io.fast_write import execute_autocommit, render
from memory_core.io.sync_driver import run_sync
from memory_core.settings import get_settings
from tests.support.snapshots import make_snapshot

CALLS: list[tuple[str, bool]] = []


class _Cursor(psycopg2.extensions.cursor):
    def execute(self, query: Any, vars: Any = None) -> Any:
        CALLS.append(("execute", self.connection.autocommit))
        return super().execute(query, vars)


class _Connection(psycopg2.extensions.connection):
    """Records every statement sent through a cursor and every commit/rollback call."""

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cursor_factory", _Cursor)
        return super().cursor(*args, **kwargs)

    def commit(self) -> None:
        CALLS.append(("commit", self.autocommit))
        super().commit()


@pytest.fixture
def counting_engine() -> Iterator[Engine]:
    url = get_settings().database_url
    engine = create_engine(url, connect_args={"connection_factory": _Connection})
    yield engine
    engine.dispose()


def _from_postgres(memory: RedisConversationMemory, tid: uuid.UUID) -> Any:
    return run_sync(memory.load_steps(tid, "user-42"), memory.sync_io())


def _thread(tid: uuid.UUID) -> Any:
    with create_engine(get_settings().database_url).connect() as conn:
        return conn.execute(
            text("SELECT last_seq FROM conversation_threads WHERE id = :id"), {"id": tid}
        ).one()


def test_a_saved_turn_is_one_autocommitted_statement(
    redis_client: redis.Redis, counting_engine: Engine
) -> None:
    memory = RedisConversationMemory(redis_client, engine=counting_engine)
    tid = uuid.uuid4()
    assert save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory).status == "saved"
    CALLS.clear()
    out = save_session_to_thread_safe(make_snapshot(tid, 2), memory=memory)
    assert (out.status, out.seq, out.cache) == ("saved", 2, "ok")
    # One statement, sent in autocommit (psycopg2 sends no BEGIN then), and no COMMIT call.
    assert CALLS == [("execute", True)]
    # Committed by itself: another connection sees it at once.
    assert _thread(tid).last_seq == 2
    # The pooled connection went back as the pool hands it out: not in autocommit.
    with counting_engine.connect() as conn:
        assert conn.connection.dbapi_connection.autocommit is False  # type: ignore[union-attr]


def test_a_redelivered_turn_takes_no_seq(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    first = make_snapshot(tid, 1)
    assert save_session_to_thread_safe(first, memory=memory).seq == 1
    again = save_session_to_thread_safe(first, memory=memory)
    assert (again.status, again.seq) == ("duplicate", 1)
    assert _thread(tid).last_seq == 1, "the failed statement's claim was undone with it"
    assert save_session_to_thread_safe(make_snapshot(tid, 2), memory=memory).seq == 2


def test_a_session_of_another_thread_is_rejected_and_writes_nothing(
    memory: RedisConversationMemory,
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    snap = make_snapshot(a, 1)
    save_session_to_thread_safe(snap, memory=memory)
    save_session_to_thread_safe(make_snapshot(b, 1), memory=memory)
    out = save_session_to_thread_safe({**snap, "thread_id": str(b)}, memory=memory)
    assert out.status == "rejected" and "another thread" in (out.reason or "")
    assert _thread(b).last_seq == 1


def test_another_owners_thread_is_not_found(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory)
    out = save_session_to_thread_safe(
        {**make_snapshot(tid, 2), "owner_id": "someone-else"}, memory=memory
    )
    assert out.status == "rejected" and "not found" in (out.reason or "")
    assert _thread(tid).last_seq == 1


def test_a_lost_connection_is_retried_on_a_fresh_one(
    redis_client: redis.Redis, counting_engine: Engine
) -> None:
    memory = RedisConversationMemory(redis_client, engine=counting_engine)
    tid = uuid.uuid4()
    save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory)
    with counting_engine.connect() as conn:  # the pooled connection the saves use
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.rollback()
    admin = psycopg2.connect(counting_engine.url.set(drivername="postgresql").render_as_string())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
    admin.close()
    out = save_session_to_thread_safe(make_snapshot(tid, 2), memory=memory)
    assert (out.status, out.seq) == ("saved", 2)


def test_a_lost_connection_is_reported_as_invalidated(counting_engine: Engine) -> None:
    with counting_engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.rollback()
    stmt = text("SELECT pg_terminate_backend(:pid)")
    # The statement kills its own connection: the error says so, the pool is renewed.
    with pytest.raises(DBAPIError) as err:
        execute_autocommit(counting_engine, stmt, {"pid": pid})
    assert err.value.connection_invalidated
    assert execute_autocommit(counting_engine, text("SELECT 1 AS one"), None)[0].one == 1


def test_errors_never_carry_the_bound_values(counting_engine: Engine) -> None:
    secret = "the user's private question"
    stmt = text("SELECT CAST(:v AS integer) AS n")
    with pytest.raises(DBAPIError) as err:
        execute_autocommit(counting_engine, stmt, {"v": secret})
    assert secret not in str(err.value.args) and "parameters" not in str(err.value).lower()


def test_render_binds_with_the_dialects_processors(counting_engine: Engine) -> None:
    from memory_core.write.claim import finalize_statement

    rendered = render(finalize_statement(), counting_engine.dialect)
    tid = uuid.uuid4()
    bound = rendered.bind({"id": tid, "response_payload": {"rows": [1, 2]}, "artifacts": "[]"})
    assert bound["id"] in (tid, str(tid))  # as the dialect sends it (psycopg2 adapts UUIDs)
    assert bound["response_payload"] == '{"rows": [1, 2]}'  # the JSONB processor serialised it
    assert bound["artifacts"] == "[]"  # JSON text already (pydantic's), cast in SQL
    # The statement's own literals (e.g. last_seq = 1 for a new thread) are bound too.
    assert all(v is not None for v in rendered.defaults.values())
    assert render(finalize_statement(), counting_engine.dialect) is rendered  # rendered once


def test_a_copy_without_its_cursor_is_served_from_postgres(
    memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    tid = uuid.uuid4()
    for n in (1, 2, 3):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    redis_client.hdel(memory.copy.keys(tid)[0], "through")
    fresh = RedisConversationMemory(redis_client, local_cache_size=0)
    ctx = fresh.get_context(tid, "user-42")
    assert [e.seq for e in ctx.recent] == [1, 2, 3]
    assert ctx == _from_postgres(fresh, tid)


def test_a_first_read_parses_the_same_context_as_postgres(
    memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    tid = uuid.uuid4()
    for n in range(1, 6):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    found = memory.copy.read_if_changed(tid, "user-42", None)
    assert found is not None and not isinstance(found, str) and found.body is not None
    assert found.body.count(b'"seq":') == 5  # one document: the turns joined in Redis
    fresh = RedisConversationMemory(redis_client, local_cache_size=0)
    assert fresh.get_context(tid, "user-42") == _from_postgres(fresh, tid)
    same = memory.copy.read_if_changed(tid, "user-42", found.version)
    assert same is not None and not isinstance(same, str) and same.body is None


def test_saved_turns_log_at_debug_only(
    memory: RedisConversationMemory, caplog: pytest.LogCaptureFixture
) -> None:
    tid = uuid.uuid4()
    with caplog.at_level(logging.INFO, logger="memory_core"):
        save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory)
    assert not [r for r in caplog.records if "finalize_saved" in r.getMessage()]
    with caplog.at_level(logging.DEBUG, logger="memory_core"):
        save_session_to_thread_safe(make_snapshot(tid, 2), memory=memory)
    saved = [r for r in caplog.records if "finalize_saved" in r.getMessage()]
    assert len(saved) == 1 and saved[0].levelno == logging.DEBUG
