"""Thread lifecycle (memory_core/lifecycle/threads.py): archive, delete, forget an owner, retention.

Against the session's Postgres and Redis (and the private Redis of tests/support/faults.py
where Redis must fail): a deleted thread leaves a tombstone (id and time only), no row, no
turn, no working copy, and nothing brings it back: not a later finalize (nor one that waited
on the delete's row lock, nor one after the `:gone` marker expired), not a copy write or a
rebuild that read Postgres just before the delete, not another process's parsed cache.
Deletion is all or nothing when Redis or Postgres fails. Events carry ids and counts, never
an owner id. test_model.py interleaves all of it against a plain model.

Every test has owners of its own, a key prefix of its own and a private event stream.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from memory_core import (
    RedisConversationMemory,
    SaveOutcome,
)
from memory_core.copy.context import Exchange
from memory_core.devservices.poll import wait_for
from memory_core.events import (
    MEMORY_THREAD_DELETED,
)
from memory_core.io.db import get_engine
from memory_core.lifecycle.threads import (
    PurgeReport,
    archive_thread,
    delete_thread,
    list_threads,
    unarchive_thread,
)
from tests.support.lifecycle import (
    STRANGER,
    Events,
    copy_keys,
    everyone_else,
    gone_key,
    has_tombstone,
    mentions,
    new_thread,
    not_found,
    of_kind,
    owner_counts,
    save,
    scalar,
    seqs,
    thread_exists,
    turn_count,
    updated_at,
)

# ------------------------------------------------------------------ archive


def test_archiving_hides_a_thread_from_the_list_and_changes_nothing_else(
    mem: RedisConversationMemory, owner: str
) -> None:
    kept, shelved = new_thread(mem, owner, 1), new_thread(mem, owner, 2)
    before = updated_at(shelved)
    assert {t.id for t in list_threads(owner, memory=mem)} == {kept, shelved}

    archive_thread(shelved, owner, memory=mem)

    assert [t.id for t in list_threads(owner, memory=mem)] == [kept]
    listed = {t.id: t for t in list_threads(owner, include_archived=True, memory=mem)}
    assert set(listed) == {kept, shelved}
    assert listed[shelved].is_archived and listed[shelved].archived_at is not None
    assert not listed[kept].is_archived and listed[kept].archived_at is None
    assert listed[shelved].turns == 2
    assert updated_at(shelved) == before, "archiving is not activity"
    # Still readable (from the copy and from Postgres) and continuable.
    assert seqs(mem, shelved, owner) == [1, 2]
    mem.invalidate(shelved)
    assert seqs(mem, shelved, owner) == [1, 2]
    out = save(mem, shelved, owner, 3)
    assert (out.status, out.seq) == ("saved", 3)
    assert seqs(mem, shelved, owner) == [1, 2, 3]
    assert updated_at(shelved) > before, "a new turn is activity"


def test_unarchiving_lists_the_thread_again(mem: RedisConversationMemory, owner: str) -> None:
    tid = new_thread(mem, owner, 1)
    archive_thread(tid, owner, memory=mem)
    archive_thread(str(tid), owner, memory=mem)  # again, by its text id: still archived
    assert list_threads(owner, memory=mem) == []
    before = updated_at(tid)

    unarchive_thread(tid, owner, memory=mem)

    (info,) = list_threads(owner, memory=mem)
    assert (info.id, info.is_archived, info.archived_at) == (tid, False, None)
    assert updated_at(tid) == before


@pytest.mark.parametrize("action", [archive_thread, unarchive_thread])
def test_archiving_answers_alike_for_foreign_unknown_and_malformed_ids(
    mem: RedisConversationMemory, owner: str, action: Callable[..., None]
) -> None:
    tid = new_thread(mem, owner, 1)
    if action is unarchive_thread:
        archive_thread(tid, owner, memory=mem)
    archived_before = list_threads(owner, include_archived=True, memory=mem)[0].is_archived
    unknown = uuid.uuid4()

    shapes = {
        not_found(lambda: action(tid, STRANGER, memory=mem), tid),
        not_found(lambda: action(tid, owner.upper(), memory=mem), tid),
        not_found(lambda: action(unknown, owner, memory=mem), unknown),
        not_found(lambda: action("not-a-uuid", owner, memory=mem), "not-a-uuid"),
        not_found(lambda: action(tid, "nul\x00owner", memory=mem), tid),
    }

    assert shapes == {"thread <id> not found"}
    (info,) = list_threads(owner, include_archived=True, memory=mem)
    assert info.is_archived == archived_before, "a stranger changed the thread"


# ------------------------------------------------------------------ delete_thread


def test_delete_thread_removes_row_turns_copy_and_leaves_only_a_tombstone(
    mem: RedisConversationMemory,
    other_process: RedisConversationMemory,
    owner: str,
    events: Events,
    log_text: Callable[[], str],
) -> None:
    tid, kept = new_thread(mem, owner, 3), new_thread(mem, owner, 2)
    bystander = f"bystander-{uuid.uuid4().hex[:8]}"
    theirs = new_thread(mem, bystander, 2)
    # Both processes have read (and parsed) the thread from its copy.
    assert seqs(mem, tid, owner) == seqs(other_process, tid, owner) == [1, 2, 3]
    assert mem._parsed.get(tid) is not None and other_process._parsed.get(tid) is not None
    assert len(copy_keys(mem, tid)) == 2
    others = everyone_else(owner)

    report = delete_thread(tid, owner, memory=mem)

    assert report == PurgeReport(threads=1, turns=3, copies=1, batches=1)
    assert not thread_exists(tid) and turn_count(tid) == 0
    assert copy_keys(mem, tid) == []
    assert 0 < mem.redis.pttl(gone_key(mem, tid)) <= mem.copy.ttl_ms
    # The tombstone: the id and a time, nothing else.
    with get_engine().connect() as conn:
        columns = conn.execute(
            text(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'thread_tombstones' AND table_schema = current_schema() "
                "ORDER BY ordinal_position"
            )
        ).scalars()
        assert list(columns) == ["thread_id", "deleted_at"]
        deleted_at = conn.execute(
            text("SELECT deleted_at FROM thread_tombstones WHERE thread_id = :t"), {"t": tid}
        ).scalar_one()
    assert abs(datetime.now(UTC) - deleted_at) < timedelta(minutes=5)
    # Neither this process's parsed cache nor another process's serves it any more.
    not_found(lambda: mem.get_context(tid, owner), tid)
    not_found(lambda: other_process.get_context(tid, owner), tid)
    not_found(lambda: other_process.rehydrate(tid, owner), tid)
    assert copy_keys(mem, tid) == [], "a failed read re-created the copy"
    # Nothing else was touched.
    assert seqs(mem, kept, owner) == [1, 2]
    assert seqs(mem, theirs, bystander) == [1, 2]
    assert everyone_else(owner) == others
    assert owner_counts(owner) == (1, 2)
    # One event, with the thread id and no owner id; no owner id in the logs either.
    entries = events()
    deleted = of_kind(entries, MEMORY_THREAD_DELETED)
    assert len(deleted) == 1 and deleted[0]["thread_id"] == str(tid)
    assert deleted[0]["reason"] == "delete"
    assert mentions(entries, owner) == []
    assert owner not in log_text()


def test_a_deleted_thread_stays_deleted_forever(mem: RedisConversationMemory, owner: str) -> None:
    tid = new_thread(mem, owner, 2)
    delete_thread(tid, owner, memory=mem)

    late = save(mem, tid, owner, 3)  # an agent still holding the thread id, a new session
    assert (late.status, late.reason, late.retryable) == ("rejected", "deleted", False)
    assert not thread_exists(tid) and copy_keys(mem, tid) == []

    # Long after: the copy TTL has passed and the marker with it. The tombstone still holds.
    mem.redis.delete(gone_key(mem, tid))
    for n in (1, 4):
        later = save(mem, tid, owner, n)
        assert (later.status, later.reason, later.retryable) == ("rejected", "deleted", False)
    assert not thread_exists(tid) and turn_count(tid) == 0
    assert copy_keys(mem, tid) == []
    not_found(lambda: mem.get_context(tid, owner), tid)
    # Deleting it again: as for any unknown thread.
    not_found(lambda: delete_thread(tid, owner, memory=mem), tid)
    assert has_tombstone(tid)


def test_a_strangers_delete_is_an_unknown_thread_and_deletes_nothing(
    mem: RedisConversationMemory, owner: str, events: Events
) -> None:
    tid = new_thread(mem, owner, 2)
    unknown = uuid.uuid4()
    others = everyone_else(owner)

    shapes = {
        not_found(lambda: delete_thread(tid, STRANGER, memory=mem), tid),
        not_found(lambda: delete_thread(tid, f" {owner}", memory=mem), tid),
        not_found(lambda: delete_thread(tid, "", memory=mem), tid),
        not_found(lambda: delete_thread(unknown, owner, memory=mem), unknown),
        not_found(lambda: delete_thread("12345", owner, memory=mem), "12345"),
    }

    assert shapes == {"thread <id> not found"}
    assert thread_exists(tid) and turn_count(tid) == 2
    assert len(copy_keys(mem, tid)) == 2 and not mem.redis.exists(gone_key(mem, tid))
    assert not has_tombstone(tid) and not has_tombstone(unknown)
    assert seqs(mem, tid, owner) == [1, 2]
    assert everyone_else(owner) == others
    assert of_kind(events(), MEMORY_THREAD_DELETED) == []


def waiting_on_a_lock(statement: str) -> bool:
    """Whether a session of this database runs `statement` (its start) waiting for a lock."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database() AND starts_with(query, :s)"
    )
    return bool(scalar(query, s=statement))


def test_a_finalize_that_waited_on_the_delete_is_rejected_and_recreates_nothing(
    mem: RedisConversationMemory, owner: str
) -> None:
    tid = new_thread(mem, owner, 2)
    results: dict[str, object] = {}

    def run(name: str, call: Callable[[], object]) -> threading.Thread:
        def target() -> None:
            try:
                results[name] = call()
            except Exception as exc:  # reported by the assertions below
                results[name] = exc

        thread = threading.Thread(target=target, name=name)
        thread.start()
        return thread

    blocker = get_engine().connect()
    try:
        blocker.begin()
        blocker.execute(
            text("SELECT id FROM thread_messages WHERE thread_id = :t AND seq = 1 FOR UPDATE"),
            {"t": tid},
        ).one()
        # The delete holds the thread row and waits on the turn we hold...
        deleter = run("delete", lambda: delete_thread(tid, owner, memory=mem))
        wait_for(
            lambda: waiting_on_a_lock("DELETE FROM thread_messages"),
            10,
            "the delete to wait on our lock",
        )
        # ...and a finalize of the thread's next turn waits on the delete's row lock.
        finalizer = run("finalize", lambda: save(mem, tid, owner, 3))
        wait_for(
            lambda: waiting_on_a_lock("WITH claim AS"),  # the finalize's one statement
            10,
            "the finalize to wait on the delete",
        )
    finally:
        blocker.rollback()
        blocker.close()
    deleter.join(30)
    finalizer.join(30)

    report = results["delete"]
    assert isinstance(report, PurgeReport) and (report.threads, report.turns) == (1, 2), report
    late = results["finalize"]
    assert isinstance(late, SaveOutcome), late
    assert (late.status, late.reason, late.retryable) == ("rejected", "deleted", False)
    assert not thread_exists(tid) and turn_count(tid) == 0 and has_tombstone(tid)
    assert copy_keys(mem, tid) == []
    not_found(lambda: mem.get_context(tid, owner), tid)


@pytest.mark.parametrize("hostile", ["a\x00b", "x\ud800y"], ids=["nul", "surrogate"])
def test_an_owner_id_no_thread_can_have_lists_no_thread(
    mem: RedisConversationMemory, hostile: str
) -> None:
    assert list_threads(hostile, memory=mem) == []


# ------------------------------------------------------------------ the gone marker


def test_the_gone_marker_refuses_every_late_copy_write(
    mem: RedisConversationMemory, owner: str
) -> None:
    tid = new_thread(mem, owner, 2)
    ctx, last = mem._load_with_last(tid, owner)
    late_turn = Exchange.model_validate(
        ctx.recent[-1].model_dump() | {"seq": last + 1, "session_id": uuid.uuid4()}
    )
    delete_thread(tid, owner, memory=mem)
    assert mem.redis.exists(gone_key(mem, tid))

    # A turn committed just before the delete, its cache write landing just after.
    assert mem.copy.append(tid, owner, 0, late_turn) == "gone"
    assert mem.record_turn(owner, tid, 0, late_turn) == "gone"
    # A rebuild from a snapshot read before the delete; a fold's summary.
    assert mem.copy.merge(owner, ctx, last) == "gone"
    assert mem.copy.refresh(owner, tid, "a summary", 1) == "gone"

    assert copy_keys(mem, tid) == []
    tag = f"{mem.key_prefix}:{{{tid}}}:*"
    assert {k.decode() for k in mem.redis.scan_iter(tag)} == {gone_key(mem, tid)}


def test_a_rebuild_that_read_postgres_before_the_delete_cannot_bring_the_copy_back(
    mem: RedisConversationMemory, other_process: RedisConversationMemory, owner: str
) -> None:
    tid = new_thread(mem, owner, 3)
    mem.invalidate(tid)  # the copy expired: the next read rebuilds it...
    ctx, last = other_process._load_with_last(tid, owner)  # ...and has read Postgres
    assert [e.seq for e in ctx.recent] == [1, 2, 3]

    delete_thread(tid, owner, memory=mem)
    other_process._store(owner, ctx, last)  # ...then writes the copy it built

    assert copy_keys(mem, tid) == []
    not_found(lambda: other_process.get_context(tid, owner), tid)
    not_found(lambda: mem.get_context(tid, owner), tid)
