"""The same behaviours through both doors (`api`: sync, async), on real Postgres and Redis:
what a save returns and writes, what a read serves (test_parity_faults.py: with a server
away or failing).

Each test asserts the outcome the synchronous API has always had (tests/test_finalize.py,
tests/test_memory.py, tests/test_guarantees.py); run on `async` it proves the async twin
returns and writes exactly that too.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import select

from memory_core import (
    RedisConversationMemory,
    ThreadNotFound,
    delete_thread,
    save_session_to_thread_safe,
)
from memory_core.io.db import session_scope
from memory_core.models import ThreadMessage
from tests.support.api import OWNER, Api, copy_members, new_thread, seqs
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs, thread_row

# ---------------------------------------------------------------- saves


def test_saves_are_saved_with_seq_one_two_three(api: Api, memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    outcomes = [api.save(make_snapshot(tid, n), memory=memory) for n in (1, 2, 3)]
    assert [(o.status, o.seq, o.cache, o.retryable) for o in outcomes] == [
        ("saved", n, "ok", False) for n in (1, 2, 3)
    ]
    assert all(o.ok and o.thread_id == str(tid) for o in outcomes)
    assert stored_seqs(tid) == [1, 2, 3]
    assert seqs(api, memory, tid) == [1, 2, 3]
    assert len(copy_members(memory, tid)) == 3


def test_a_redelivered_session_is_a_duplicate_with_its_stored_seq(
    api: Api, memory: RedisConversationMemory
) -> None:
    tid = new_thread(api, memory, 1)
    snap = make_snapshot(tid, 2)
    outcomes = [api.save(snap, memory=memory) for _ in range(3)]
    assert [(o.status, o.seq) for o in outcomes] == [("saved", 2)] + [("duplicate", 2)] * 2
    sid = snap["session_id"]
    assert outcomes[1].reason == f"session {sid} already saved" and outcomes[1].ok
    assert api.save(make_snapshot(tid, 3), memory=memory).seq == 3, "a duplicate burnt a seq"
    assert stored_seqs(tid) == [1, 2, 3]
    assert len(copy_members(memory, tid)) == 3


def test_a_redelivery_after_a_lost_cache_write_puts_the_turn_in_the_copy(
    api: Api, memory: RedisConversationMemory, offline: RedisConversationMemory
) -> None:
    tid = new_thread(api, memory, 3)
    snap = make_snapshot(tid, 4)
    # The first delivery committed, then its cache write failed (Redis away).
    first = api.save(snap, memory=offline)
    assert (first.status, first.seq, first.cache) == ("saved", 4, "unavailable")
    assert len(copy_members(memory, tid)) == 3  # the crash window
    again = api.save(snap | {"user_query": "what the redelivery says"}, memory=memory)
    assert (again.status, again.seq) == ("duplicate", 4)
    ctx = api.get_context(memory, tid, OWNER)
    assert [e.seq for e in ctx.recent] == [1, 2, 3, 4]
    assert ctx.recent[-1].user_query.startswith("Revenue by region"), "not what was stored"
    assert len(copy_members(memory, tid)) == 4


def test_concurrent_saves_land_once_with_gapless_seqs(
    api: Api, memory: RedisConversationMemory
) -> None:
    """Many callers at once (threads on the sync door, coroutines on the one loop of the
    async door): the same turn lands once, distinct turns get seq 1..n without gaps."""
    tid = new_thread(api, memory, 1)
    snap = make_snapshot(tid, 2)
    with ThreadPoolExecutor(16) as pool:
        same = list(pool.map(lambda _: api.save(snap, memory=memory), range(24)))
        distinct = list(
            pool.map(lambda n: api.save(make_snapshot(tid, n), memory=memory), range(3, 19))
        )
    assert sorted(o.status for o in same) == ["duplicate"] * 23 + ["saved"]
    assert {o.seq for o in same} == {2}
    assert all(o.status == "saved" for o in distinct), distinct
    assert sorted(o.seq or 0 for o in distinct) == list(range(3, 19))
    assert stored_seqs(tid) == list(range(1, 19))
    assert seqs(api, memory, tid) == list(range(1, 19))
    assert len(copy_members(memory, tid)) == 18


def _bad_inputs(tid: uuid.UUID) -> list[Any]:
    huge = {"blob": "o" * (1024 * 1024)}
    return [
        make_snapshot(tid, 1, agent_type="robot", user_query="x" * 9000),
        make_snapshot(tid, 1, session_id="nope"),
        {**make_snapshot(tid, 1), "sesion_id": "typo"},
        make_snapshot(tid, 1, visualizations=[{"id": 1, "type": "CHART", "options": huge}] * 5),
        "not a snapshot",
        None,
    ]


def test_bad_input_is_rejected_with_the_same_reason_and_nothing_written(
    api: Api, memory: RedisConversationMemory
) -> None:
    tid = uuid.uuid4()
    for bad in _bad_inputs(tid):
        out = api.save(bad, memory=memory)
        reference = save_session_to_thread_safe(bad, memory=memory)  # the sync door's answer
        assert reference.status == "rejected"
        assert (out.status, out.retryable, out.ok) == ("rejected", False, False), out
        assert out.reason == reference.reason, (api.kind, bad if len(str(bad)) < 500 else "")
        assert out.seq is None
    assert thread_row(tid) is None
    assert memory.copy.read(tid) == ({}, [])


def test_a_strangers_thread_is_rejected(api: Api, memory: RedisConversationMemory) -> None:
    tid = new_thread(api, memory, 1)
    out = api.save(make_snapshot(tid, 2, owner_id="mallory"), memory=memory)
    assert (out.status, out.reason, out.retryable) == ("rejected", f"thread {tid} not found", False)
    assert stored_seqs(tid) == [1]
    assert seqs(api, memory, tid) == [1]


def test_a_session_already_used_in_another_thread_is_rejected(
    api: Api, memory: RedisConversationMemory
) -> None:
    first = new_thread(api, memory, 2)
    with session_scope() as s:
        reused = str(
            s.scalars(
                select(ThreadMessage.session_id).where(ThreadMessage.thread_id == first)
            ).all()[-1]
        )
    other = uuid.uuid4()
    out = api.save(make_snapshot(other, 1, session_id=reused), memory=memory)
    expected = f"session {reused} is already a turn of another thread"
    assert (out.status, out.reason, out.retryable) == ("rejected", expected, False)
    assert thread_row(other) is None
    assert memory.copy.read(other) == ({}, [])
    assert seqs(api, memory, first) == [1, 2]


def test_a_deleted_thread_is_rejected(api: Api, memory: RedisConversationMemory) -> None:
    tid = new_thread(api, memory, 2)
    delete_thread(tid, OWNER, memory=memory)
    out = api.save(make_snapshot(tid, 3), memory=memory)
    assert (out.status, out.reason, out.retryable) == ("rejected", "deleted", False)
    assert stored_seqs(tid) == []
    assert memory.copy.read(tid) == ({}, [])
    with pytest.raises(ThreadNotFound):
        api.get_context(memory, tid, OWNER)


# ---------------------------------------------------------------- reads


def test_a_hit_equals_the_postgres_rehydrate(api: Api, memory: RedisConversationMemory) -> None:
    tid = new_thread(api, memory, 12)
    hit = api.get_context(memory, tid, OWNER)
    assert [e.seq for e in hit.recent] == list(range(1, 13))
    assert hit.missing_session_ids == []
    memory.invalidate(tid)
    miss = api.get_context(memory, tid, OWNER)
    assert miss == hit and miss.model_dump_json() == hit.model_dump_json()
    assert memory.copy.read(tid)[0], "the miss repopulates the copy"
    memory.invalidate(tid)
    assert memory.rehydrate(tid, OWNER) == hit  # the sync door's Postgres read
    assert api.get_context(memory, tid, OWNER) == memory.get_context(tid, OWNER)


def test_a_stranger_a_malformed_id_and_an_unknown_thread_are_not_found_alike(
    api: Api, memory: RedisConversationMemory
) -> None:
    tid = new_thread(api, memory, 2)
    unknown = uuid.uuid4()
    errors = []
    asked: list[tuple[uuid.UUID | str, str]] = [
        (tid, "mallory"),
        (unknown, OWNER),
        ("not-a-uuid", OWNER),
        (tid, "user-42\x00"),
    ]
    for thread_id, owner in asked:
        with pytest.raises(ThreadNotFound) as caught:
            api.get_context(memory, thread_id, owner)
        errors.append(str(caught.value))
    memory.invalidate(tid)
    with pytest.raises(ThreadNotFound) as on_a_miss:
        api.get_context(memory, tid, "mallory")
    assert errors[:2] == [f"thread {tid} not found", f"thread {unknown} not found"]
    assert errors[2:] == ["thread not-a-uuid not found", f"thread {tid} not found"]
    assert str(on_a_miss.value) == errors[0]
    assert memory.copy.read(tid) == ({}, []), "a stranger's miss made a copy"
    assert seqs(api, memory, tid) == [1, 2]


def test_wait_arguments_are_checked_alike(api: Api, memory: RedisConversationMemory) -> None:
    tid = new_thread(api, memory, 2)
    sid = str(uuid.uuid4())
    bad: list[dict[str, Any]] = [
        {"wait_for": "not-a-session-id"},
        {"wait_for": sid, "wait_s": -1},
        {"wait_for": sid, "wait_s": 301},
        {"wait_for": sid, "wait_s": float("nan")},
        {"wait_for": sid, "on_timeout": "ignore"},
    ]
    for kw in bad:
        with pytest.raises(ValueError) as caught:
            api.get_context(memory, tid, OWNER, **kw)
        with pytest.raises(ValueError) as reference:
            memory.get_context(tid, OWNER, **kw)
        assert str(caught.value) == str(reference.value), kw
    # Nothing to wait for: a plain read (a rejected outcome has no session to wait on).
    rejected = api.save("not a snapshot", memory=memory)
    for nothing in (None, rejected):
        ctx = api.get_context(memory, tid, OWNER, wait_for=nothing, wait_s=0)
        assert [e.seq for e in ctx.recent] == [1, 2] and ctx.missing_session_ids == []
