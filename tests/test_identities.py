"""What counts as an identity: an owner id of whitespace alone names nobody, at every door."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_core import (
    RedisConversationMemory,
    ThreadNotFound,
    delete_thread,
    forget_owner,
    save_session_to_thread_safe,
)
from memory_core.lifecycle.threads import list_threads
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs

# Unicode's whitespace as str.strip knows it: spaces (Zs), separators, ASCII and C1 controls.
WHITESPACE = st.characters(categories=["Zs", "Zl", "Zp"]) | st.sampled_from(
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85"
)
BLANK = st.text(WHITESPACE, max_size=6)


# The memory fixture holds nothing per example: sharing it across examples is safe.
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(owner=BLANK)
def test_a_blank_owner_is_refused_at_every_door(
    owner: str, memory: RedisConversationMemory
) -> None:
    assert not owner.strip()
    tid = uuid.uuid4()
    out = save_session_to_thread_safe(make_snapshot(tid, 1, owner_id=owner), memory=memory)
    assert (out.status, out.retryable) == ("rejected", False), out
    assert out.reason is not None and "owner_id" in out.reason
    assert stored_seqs(tid) == []
    with pytest.raises(ThreadNotFound):
        memory.get_context(tid, owner)
    assert list_threads(owner, memory=memory) == []
    with pytest.raises(ThreadNotFound):
        delete_thread(tid, owner, memory=memory)
    with pytest.raises(ValueError, match="owner_id"):
        forget_owner(owner, memory=memory)


@pytest.mark.parametrize(
    ("owner", "other"),
    [("alice ", "alice"), (" alice", "alice"), ("a\u3000b", "a b"), ("\u3000x", "x")],
)
def test_an_owner_with_whitespace_beside_text_is_an_identity_of_its_own(
    owner: str, other: str, memory: RedisConversationMemory
) -> None:
    tid = uuid.uuid4()
    out = save_session_to_thread_safe(make_snapshot(tid, 1, owner_id=owner), memory=memory)
    assert out.status == "saved", out
    assert [e.seq for e in memory.get_context(tid, owner).recent] == [1]
    with pytest.raises(ThreadNotFound):
        memory.get_context(tid, other)


@pytest.mark.parametrize("limit", [0, -1, 10_001, True])
def test_listing_refuses_a_limit_out_of_range(limit: int, memory: RedisConversationMemory) -> None:
    with pytest.raises(ValueError, match="limit must be"):
        list_threads("alice", limit=limit, memory=memory)
