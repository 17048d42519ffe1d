"""Product queries on the fat models: history list, transcript page, archive flags."""

from __future__ import annotations

import uuid

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread, ThreadMessage
from tests.support.snapshots import make_snapshot


def test_history_newest_first_paginated_archived_hidden(memory: RedisConversationMemory) -> None:
    owner = f"owner-{uuid.uuid4().hex[:8]}"
    tids = [uuid.uuid4() for _ in range(5)]
    for i, tid in enumerate(tids):
        save_session_to_thread_safe(
            make_snapshot(tid, 1, owner_id=owner, agent_type="copilot" if i % 2 else "chat"),
            memory=memory,
        )
    save_session_to_thread_safe(
        make_snapshot(uuid.uuid4(), 1, owner_id="someone-else"), memory=memory
    )
    # Activity moves a thread to the top.
    save_session_to_thread_safe(make_snapshot(tids[0], 2, owner_id=owner), memory=memory)
    with session_scope() as s:
        ConversationThread.get_owned(s, tids[3], owner).set_archived(True)
    with session_scope() as s:
        page1 = ConversationThread.history(s, owner, limit=2)
        page2 = ConversationThread.history(
            s, owner, limit=2, before=(page1[-1].updated_at, page1[-1].id)
        )
        page3 = ConversationThread.history(
            s, owner, limit=2, before=(page2[-1].updated_at, page2[-1].id)
        )
        everything = ConversationThread.history(s, owner, limit=10, include_archived=True)
    listed = [t.id for t in page1 + page2 + page3]
    assert listed == [tids[0], tids[4], tids[2], tids[1]]
    assert tids[3] in [t.id for t in everything] and len(everything) == 5
    assert all(t.owner_id == owner for t in everything)


def test_transcript_pages_in_order_and_is_owner_checked(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    for n in range(1, 8):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    with session_scope() as s:
        first = ThreadMessage.transcript(s, tid, "user-42", limit=4)
        rest = ThreadMessage.transcript(s, tid, "user-42", after_seq=first[-1].seq, limit=4)
        stranger = ThreadMessage.transcript(s, tid, "mallory")
    assert [m.seq for m in first + rest] == list(range(1, 8))
    assert [m.response_payload["blocks"][0]["text"] for m in first + rest] == [
        f"answer {n}" for n in range(1, 8)
    ]
    assert stranger == []


def test_unarchive_clears_flags(memory: RedisConversationMemory) -> None:
    tid = uuid.uuid4()
    save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory)
    with session_scope() as s:
        ConversationThread.get_owned(s, tid, "user-42").set_archived(True)
    with session_scope() as s:
        t = ConversationThread.get_owned(s, tid, "user-42")
        assert t.is_archived and t.archived_at is not None
        t.set_archived(False)
    with session_scope() as s:
        t = ConversationThread.get_owned(s, tid, "user-42")
        assert not t.is_archived and t.archived_at is None
