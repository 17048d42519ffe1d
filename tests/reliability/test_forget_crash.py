"""Forget-owner killed with -9 in the middle of a batch, then run again.

60 threads x 5 turns of one owner (and a few of another owner's). `forget_owner(batch_size=5)`
runs in a process of its own (tests/support/forget_process.py). The test holds a row lock on
one turn of the first thread of the fifth batch, so that batch's transaction stops between its
Redis step (copies deleted, `:gone` markers set) and its COMMIT, waiting on its
`DELETE FROM thread_messages`. There the process is killed with SIGKILL; then the lock is
released and the dead client's transaction ends (rolled back).

Checked: four batches deleted completely (rows, turns, copies, tombstones), the fifth not at
all (rows and every turn still there, readable from Postgres; only its copies are gone), no
thread half-deleted; a second run in-process deletes exactly what is left and leaves nothing
of the owner (rows, turns, copy keys; a tombstone for every thread), and the other owner's
threads are untouched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Connection, text

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.poll import wait_for
from memory_core.events import MEMORY_OWNER_FORGOTTEN, MEMORY_THREAD_DELETED
from memory_core.io.db import get_engine
from memory_core.lifecycle.threads import forget_owner
from memory_core.settings import get_settings
from tests.support import REPO
from tests.support.lifecycle import thread_states
from tests.support.services import Stack
from tests.support.snapshots import make_snapshot

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

THREADS, TURNS, BATCH = 60, 5, 5
DONE = 4  # batches committed before the kill; batch DONE + 1 is the one killed mid-way
OWNER = "forget-me"
OTHER = "stays"
APP = f"forget-crash-{os.getpid()}"


def counts(owner: str) -> tuple[int, int]:
    """(threads, turns) of `owner`."""
    query = text(
        "SELECT count(DISTINCT t.id), count(m.id) FROM conversation_threads t "
        "LEFT JOIN thread_messages m ON m.thread_id = t.id WHERE t.owner_id = :o"
    )
    with get_engine().connect() as conn:
        row = conn.execute(query, {"o": owner}).one()
    return int(row[0]), int(row[1])


def backends(state: str = "") -> list[Any]:
    """The forget process's Postgres sessions (`state` "Lock": those waiting on a lock)."""
    query = "SELECT pid, wait_event_type, query FROM pg_stat_activity WHERE application_name = :a"
    if state:
        query += " AND wait_event_type = :w"
    with get_engine().connect() as conn:
        return list(conn.execute(text(query), {"a": APP, "w": state}).all())


def new_thread(memory: RedisConversationMemory, owner: str, turns: int) -> uuid.UUID:
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        out = save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=memory)
        assert (out.status, out.seq) == ("saved", n), out
    return tid


def has_copy(memory: RedisConversationMemory, tid: uuid.UUID) -> bool:
    return bool(memory.redis.exists(*memory.copy.keys(tid)))


def events(memory: RedisConversationMemory) -> list[dict[str, str]]:
    stream = get_settings().memory_events_stream
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], memory.redis.xrange(stream))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


@pytest.fixture
def blocker() -> Iterator[Connection]:
    """A transaction of the test's own, to hold row locks in; rolled back afterwards."""
    conn = get_engine().connect()
    conn.begin()
    yield conn
    conn.rollback()
    conn.close()


def test_forget_owner_killed_mid_batch_then_rerun(
    stack: Stack, tmp_path: Path, blocker: Connection
) -> None:
    memory = RedisConversationMemory()
    tids = [new_thread(memory, OWNER, TURNS) for _ in range(THREADS)]
    theirs = [new_thread(memory, OTHER, 3) for _ in range(4)]
    assert all(has_copy(memory, t) for t in tids)
    order = sorted(tids)  # the order forget_owner takes them in (uuid order, bytewise)
    committed, in_flight = order[: DONE * BATCH], order[DONE * BATCH : (DONE + 1) * BATCH]
    blocker.execute(
        text("SELECT id FROM thread_messages WHERE thread_id = :t AND seq = 3 FOR UPDATE"),
        {"t": in_flight[0]},
    ).one()
    progress = tmp_path / "progress.jsonl"
    log_path = tmp_path / "forget.log"
    argv = [sys.executable, "-m", "tests.support.forget_process", OWNER, str(BATCH)]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*argv, str(progress), APP], cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def diagnostics() -> str:
            lines = progress.read_text() if progress.exists() else "(no progress)"
            return f"{log_path.read_text()}\n{lines}\nsessions: {backends()}"

        def waiting() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the forget process exited early:\n{diagnostics()}")
            return bool(backends("Lock"))

        wait_for(waiting, 60, "the forget run to block inside its fifth batch", diagnostics)
        # Mid-batch: four batches committed, the fifth past its Redis step, before COMMIT.
        (session,) = backends("Lock")
        assert session.query.startswith("DELETE FROM thread_messages"), session.query
        reports = [json.loads(line) for line in progress.read_text().splitlines()]
        # Once before the first batch, then after each committed one.
        assert [r["threads"] for r in reports] == [0, 5, 10, 15, 20]
        assert [r["total"] for r in reports] == [THREADS] * (DONE + 1)
        for tid in in_flight:
            assert not has_copy(memory, tid)
            assert memory.redis.exists(memory.copy.write_keys(tid)[2])

        proc.kill()
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        blocker.rollback()  # the dead client's DELETE goes on, then its session ends

    wait_for(lambda: not backends(), 30, "the killed run's session to end", lambda: str(backends()))

    # Consistent: every thread whole or gone for good, none half-deleted.
    after = thread_states(tids)
    whole, gone = (True, TURNS, False), (False, 0, True)
    torn = {t: s for t, s in after.items() if s not in (whole, gone)}
    assert torn == {}, f"half-deleted threads (row, turns, tombstone): {torn}"
    assert {t for t, s in after.items() if s == gone} == set(committed)
    assert counts(OWNER) == (THREADS - len(committed), (THREADS - len(committed)) * TURNS)
    # The batch killed mid-way is all there: every turn, served from Postgres (its copies
    # went in the Redis step; the markers keep them from coming back until the rerun).
    for tid in in_flight:
        assert [e.seq for e in memory.get_context(tid, OWNER).recent] == list(range(1, 6))
        assert not has_copy(memory, tid)
    deleted_events = {e["thread_id"] for e in events(memory) if e["event"] == MEMORY_THREAD_DELETED}
    assert deleted_events == {str(t) for t in committed}
    assert not [e for e in events(memory) if e["event"] == MEMORY_OWNER_FORGOTTEN]

    report = forget_owner(OWNER, memory=memory, batch_size=BATCH)

    left = THREADS - len(committed)
    assert (report.threads, report.turns) == (left, left * TURNS)
    assert report.copies == left - BATCH  # the killed batch's copies were already gone
    assert report.batches == left // BATCH
    assert (report.remaining_threads, report.remaining_checkpoints) == (0, 0)
    assert counts(OWNER) == (0, 0)
    assert set(thread_states(tids).values()) == {gone}
    assert not any(has_copy(memory, t) for t in tids)
    assert counts(OTHER) == (4, 12)
    for tid in theirs:
        assert [e.seq for e in memory.get_context(tid, OTHER).recent] == [1, 2, 3]
        assert has_copy(memory, tid)
    stream = events(memory)
    assert {e["thread_id"] for e in stream if e["event"] == MEMORY_THREAD_DELETED} == {
        str(t) for t in tids
    }
    assert [e["threads"] for e in stream if e["event"] == MEMORY_OWNER_FORGOTTEN] == [str(left)]
    assert not [e for e in stream if any(OWNER in v for v in e.values())]
