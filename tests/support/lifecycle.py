"""Helpers of the lifecycle tests (tests/lifecycle/): counts, keys, events, clocks."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import text

from memory_core import (
    RedisConversationMemory,
    SaveOutcome,
    ThreadNotFound,
    save_session_to_thread_safe,
)
from memory_core.io.db import get_engine
from tests.support.snapshots import make_snapshot

STRANGER = "mallory"
Events = Callable[[], list[dict[str, str]]]


# ------------------------------------------------------------------ helpers


def save(mem: RedisConversationMemory, tid: uuid.UUID, owner: str, n: int) -> SaveOutcome:
    return save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=mem)


def new_thread(mem: RedisConversationMemory, owner: str, turns: int) -> uuid.UUID:
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        out = save(mem, tid, owner, n)
        assert (out.status, out.seq) == ("saved", n), out
    return tid


def scalar(query: str, **params: Any) -> Any:
    with get_engine().connect() as conn:
        return conn.execute(text(query), params).scalar()


def thread_exists(tid: uuid.UUID) -> bool:
    return bool(scalar("SELECT count(*) FROM conversation_threads WHERE id = :t", t=tid))


def turn_count(tid: uuid.UUID) -> int:
    return int(scalar("SELECT count(*) FROM thread_messages WHERE thread_id = :t", t=tid))


def has_tombstone(tid: uuid.UUID) -> bool:
    return bool(scalar("SELECT count(*) FROM thread_tombstones WHERE thread_id = :t", t=tid))


def owner_counts(owner: str) -> tuple[int, int]:
    """(threads, turns) of `owner`."""
    with get_engine().connect() as conn:
        threads = conn.execute(
            text("SELECT count(*) FROM conversation_threads WHERE owner_id = :o"), {"o": owner}
        ).scalar_one()
        turns = conn.execute(
            text(
                "SELECT count(*) FROM thread_messages m JOIN conversation_threads t "
                "ON t.id = m.thread_id WHERE t.owner_id = :o"
            ),
            {"o": owner},
        ).scalar_one()
    return int(threads), int(turns)


def everyone_else(owner: str) -> tuple[int, int]:
    """(threads, turns) of every owner but `owner`, in the whole database."""
    with get_engine().connect() as conn:
        threads = conn.execute(
            text("SELECT count(*) FROM conversation_threads WHERE owner_id <> :o"), {"o": owner}
        ).scalar_one()
        turns = conn.execute(
            text(
                "SELECT count(*) FROM thread_messages m JOIN conversation_threads t "
                "ON t.id = m.thread_id WHERE t.owner_id <> :o"
            ),
            {"o": owner},
        ).scalar_one()
    return int(threads), int(turns)


def thread_states(tids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[bool, int, bool]]:
    """(row exists, turns stored, tombstone) of each thread, in one query."""
    query = text(
        "SELECT x.id, "
        "EXISTS (SELECT 1 FROM conversation_threads t WHERE t.id = x.id), "
        "(SELECT count(*) FROM thread_messages m WHERE m.thread_id = x.id), "
        "EXISTS (SELECT 1 FROM thread_tombstones s WHERE s.thread_id = x.id) "
        "FROM unnest(CAST(:ids AS uuid[])) AS x(id)"
    )
    with get_engine().connect() as conn:
        rows = conn.execute(query, {"ids": [str(t) for t in tids]}).all()
    return {uuid.UUID(str(r[0])): (bool(r[1]), int(r[2]), bool(r[3])) for r in rows}


def owners_counts(owners: list[str]) -> dict[str, tuple[int, int]]:
    """(threads, turns) per owner, in one query (owners without threads are left out)."""
    query = text(
        "SELECT t.owner_id, count(DISTINCT t.id), count(m.id) FROM conversation_threads t "
        "LEFT JOIN thread_messages m ON m.thread_id = t.id "
        "WHERE t.owner_id = ANY(:owners) GROUP BY t.owner_id"
    )
    with get_engine().connect() as conn:
        return {r[0]: (int(r[1]), int(r[2])) for r in conn.execute(query, {"owners": owners})}


def set_updated_at(tid: uuid.UUID, when: datetime) -> None:
    with get_engine().begin() as conn:
        conn.execute(
            text("UPDATE conversation_threads SET updated_at = :w WHERE id = :t"),
            {"w": when, "t": tid},
        )


def updated_at(tid: uuid.UUID) -> datetime:
    value = scalar("SELECT updated_at FROM conversation_threads WHERE id = :t", t=tid)
    assert isinstance(value, datetime)
    return value


def copy_keys(mem: RedisConversationMemory, tid: uuid.UUID) -> list[str]:
    """Those of the thread's two copy keys that exist."""
    return [k for k in mem.copy.keys(tid) if mem.redis.exists(k)]


def gone_key(mem: RedisConversationMemory, tid: uuid.UUID) -> str:
    return mem.copy.write_keys(tid)[2]


def seqs(mem: RedisConversationMemory, tid: uuid.UUID, owner: str) -> list[int]:
    return [e.seq for e in mem.get_context(tid, owner).recent]


def not_found(call: Callable[[], object], given: object) -> str:
    """`call` raises ThreadNotFound worded as for any id: "thread <given> not found"."""
    with pytest.raises(ThreadNotFound) as caught:
        call()
    assert str(caught.value) == f"thread {given} not found"
    return str(caught.value).replace(str(given), "<id>")


def of_kind(entries: list[dict[str, str]], kind: str) -> list[dict[str, str]]:
    return [e for e in entries if e.get("event") == kind]


def mentions(entries: list[dict[str, str]], needle: str) -> list[dict[str, str]]:
    return [e for e in entries if any(needle in k or needle in v for k, v in e.items())]
