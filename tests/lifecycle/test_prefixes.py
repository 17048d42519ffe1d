"""A delete reaches the copies of processes on another key prefix (issue 30, item 13).

Changing `MEMORY_KEY_PREFIX` is the documented upgrade path: for a while, processes on the old
prefix and on the new one run side by side, each reading and writing its own copies. Every
process records its prefix in `memory_settings_seen`; a delete, a forget and retention remove
a thread's copy under each prefix on record and leave the `gone` marker there too, so the old
processes neither serve the deleted turns nor write them back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import text

from memory_core import RedisConversationMemory
from memory_core.copy.settings_check import fingerprint
from memory_core.devservices.poll import wait_for
from memory_core.io.db import get_engine
from memory_core.lifecycle.threads import delete_thread, forget_owner
from tests.support.lifecycle import copy_keys, gone_key, new_thread, not_found, save, seqs


def _recorded(mem: RedisConversationMemory) -> bool:
    with get_engine().connect() as conn:
        return bool(
            conn.execute(
                text("SELECT count(*) FROM memory_settings_seen WHERE fingerprint = :f"),
                {"f": fingerprint(mem)},
            ).scalar()
        )


@pytest.fixture
def old_and_new(redis_client: redis.Redis) -> Iterator[tuple[RedisConversationMemory, ...]]:
    """Two processes' memories on one Redis: one still on the old prefix, one on the new."""
    tag = uuid.uuid4().hex[:8]
    old = RedisConversationMemory(redis_client, key_prefix=f"old_{tag}")
    new = RedisConversationMemory(redis_client, key_prefix=f"new_{tag}")
    # Each memory records its fingerprint off the caller's path: wait until both are in.
    wait_for(lambda: _recorded(old) and _recorded(new), timeout_s=10, what="fingerprints")
    yield old, new
    # Other tests' processes would warn about these prefixes for two hours: take them out.
    with get_engine().begin() as conn:
        conn.execute(
            text("DELETE FROM memory_settings_seen WHERE fingerprint IN (:a, :b)"),
            {"a": fingerprint(old), "b": fingerprint(new)},
        )


def test_a_delete_on_the_new_prefix_removes_the_copy_under_the_old_one(
    old_and_new: tuple[RedisConversationMemory, RedisConversationMemory], owner: str
) -> None:
    old, new = old_and_new
    tid = new_thread(old, owner, 3)
    assert seqs(old, tid, owner) == [1, 2, 3] and copy_keys(old, tid)

    report = delete_thread(tid, owner, memory=new)

    assert report.copies == 1
    assert copy_keys(old, tid) == [] and old.redis.exists(gone_key(old, tid))
    not_found(lambda: old.get_context(tid, owner), tid)  # served nowhere
    late = save(old, tid, owner, 4)  # a finalize still on the old prefix
    assert (late.status, late.reason) == ("rejected", "deleted")
    assert copy_keys(old, tid) == [] and copy_keys(new, tid) == []


def test_forgetting_an_owner_on_the_old_prefix_removes_copies_under_the_new_one(
    old_and_new: tuple[RedisConversationMemory, RedisConversationMemory], owner: str
) -> None:
    old, new = old_and_new
    tids = [new_thread(new, owner, 2) for _ in range(3)]
    assert all(seqs(new, tid, owner) == [1, 2] and copy_keys(new, tid) for tid in tids)

    forget_owner(owner, memory=old)

    for tid in tids:
        assert copy_keys(new, tid) == [] and new.redis.exists(gone_key(new, tid))
        not_found(lambda t=tid: new.get_context(t, owner), tid)  # type: ignore[misc]
