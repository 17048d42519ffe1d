"""forget_owner (batches, report, idempotent) and retention (a clock the test controls)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memory_core import (
    RedisConversationMemory,
)
from memory_core.events import (
    MEMORY_OWNER_FORGOTTEN,
    MEMORY_RETENTION_RUN,
    MEMORY_THREAD_DELETED,
)
from memory_core.lifecycle.threads import (
    PurgeReport,
    apply_retention,
    archive_thread,
    delete_thread,
    forget_owner,
    list_threads,
)
from tests.support.lifecycle import (
    Events,
    copy_keys,
    everyone_else,
    gone_key,
    has_tombstone,
    mentions,
    new_thread,
    of_kind,
    owner_counts,
    save,
    seqs,
    set_updated_at,
    thread_exists,
    turn_count,
)

# ------------------------------------------------------------------ forget_owner


def test_forget_owner_deletes_every_thread_in_batches_and_reports_it(
    mem: RedisConversationMemory, owner: str, events: Events, log_text: Callable[[], str]
) -> None:
    turns = [1 + i % 3 for i in range(25)]
    tids = [new_thread(mem, owner, n) for n in turns]
    for tid in tids[:4]:
        mem.invalidate(tid)  # their copies expired: 21 copies left
    bystander = f"bystander-{uuid.uuid4().hex[:8]}"
    theirs = [new_thread(mem, bystander, 2) for _ in range(3)]
    others = everyone_else(owner)
    seen: list[tuple[dict[str, int], int]] = []

    report = forget_owner(
        owner, memory=mem, batch_size=4, progress=lambda r, total: seen.append((r.as_dict(), total))
    )

    assert (report.threads, report.turns, report.copies) == (25, sum(turns), 21)
    assert report.batches == math.ceil(25 / 4) == 7
    assert (report.remaining_threads, report.remaining_checkpoints) == (0, 0)
    # Once before the first batch (the total known), then after each batch.
    assert [s[0]["threads"] for s in seen] == [0, 4, 8, 12, 16, 20, 24, 25]
    assert [s[0]["batches"] for s in seen] == list(range(8))
    assert [s[1] for s in seen] == [25] * 8
    assert [s[0]["turns"] for s in seen] == sorted(s[0]["turns"] for s in seen)
    assert seen[-1][0]["turns"] == sum(turns)
    assert owner_counts(owner) == (0, 0)
    for tid in tids:
        assert has_tombstone(tid) and copy_keys(mem, tid) == []
        assert mem.redis.exists(gone_key(mem, tid))
    # The bystander's threads are untouched.
    assert everyone_else(owner) == others
    for tid in theirs:
        assert seqs(mem, tid, bystander) == [1, 2] and len(copy_keys(mem, tid)) == 2

    again = forget_owner(
        owner, memory=mem, batch_size=4, progress=lambda r, t: seen.append(({}, t))
    )

    assert again.as_dict() == PurgeReport().as_dict() | {
        "remaining_threads": 0,
        "remaining_checkpoints": 0,
    }
    assert seen[8:] == [({}, 0)], "nothing left: only the call before the first batch"
    entries = events()
    forgotten = of_kind(entries, MEMORY_OWNER_FORGOTTEN)
    assert len(forgotten) == 2
    first, second = forgotten
    assert (first["threads"], first["turns"], first["copies"]) == ("25", str(sum(turns)), "21")
    assert (first["batches"], first["remaining_threads"]) == ("7", "0")
    assert (second["threads"], second["turns"], second["batches"]) == ("0", "0", "0")
    assert {e["thread_id"] for e in of_kind(entries, MEMORY_THREAD_DELETED)} == {
        str(t) for t in tids
    }
    assert len(of_kind(entries, MEMORY_THREAD_DELETED)) == 25
    assert mentions(entries, owner) == []
    assert owner not in log_text()


@pytest.mark.parametrize(
    "bad", ["", "a\x00b", "x\ud800y", None, 42], ids=["empty", "nul", "surrogate", "none", "int"]
)
def test_forget_owner_refuses_what_is_no_owner_id(mem: RedisConversationMemory, bad: Any) -> None:
    others = everyone_else("\x01")
    with pytest.raises(ValueError, match="owner_id must be a non-empty string"):
        forget_owner(bad, memory=mem)
    assert everyone_else("\x01") == others


# ------------------------------------------------------------------ retention

# A clock of the tests' own, years before any other test's threads: retention runs over the
# whole database, and only these tests' threads are this old.
EPOCH = datetime(2001, 3, 1, 12, tzinfo=UTC)


def aged(mem: RedisConversationMemory, owner: str, turns: int, idle_days: float) -> uuid.UUID:
    tid = new_thread(mem, owner, turns)
    set_updated_at(tid, EPOCH - timedelta(days=idle_days))
    return tid


def test_retention_deletes_only_threads_idle_longer_than_the_window(
    mem: RedisConversationMemory, owner: str, events: Events, log_text: Callable[[], str]
) -> None:
    old = [aged(mem, owner, 2, 10), aged(mem, owner, 3, 30)]
    old_archived = aged(mem, owner, 1, 8)
    archive_thread(old_archived, owner, memory=mem)
    fresh = [aged(mem, owner, 2, 1), aged(mem, owner, 1, 6.9)]
    revived = aged(mem, owner, 2, 20)
    assert save(mem, revived, owner, 3).status == "saved"  # a new turn: no longer old
    others = everyone_else(owner)

    result = apply_retention(memory=mem, now=EPOCH, days=7, batch_size=2)

    assert (result.enabled, result.dry_run, result.cutoff) == (True, False, EPOCH - timedelta(7))
    d = result.deleted
    assert (d.threads, d.turns, d.copies, d.batches) == (3, 6, 3, 2)
    for tid in [*old, old_archived]:
        assert not thread_exists(tid) and turn_count(tid) == 0 and has_tombstone(tid)
        assert copy_keys(mem, tid) == []
    for tid in [*fresh, revived]:
        assert thread_exists(tid) and not has_tombstone(tid)
    assert seqs(mem, revived, owner) == [1, 2, 3]
    assert everyone_else(owner) == others
    entries = events()
    (run,) = of_kind(entries, MEMORY_RETENTION_RUN)
    assert (run["threads"], run["turns"], run["copies"], run["batches"]) == ("3", "6", "3", "2")
    assert (run["dry_run"], run["cutoff"]) == ("False", (EPOCH - timedelta(7)).isoformat())
    deleted = of_kind(entries, MEMORY_THREAD_DELETED)
    assert {e["thread_id"] for e in deleted} == {str(t) for t in [*old, old_archived]}
    assert {e["reason"] for e in deleted} == {"retention"}
    assert mentions(entries, owner) == [] and owner not in log_text()
    # A second run finds nothing more.
    assert apply_retention(memory=mem, now=EPOCH, days=7).deleted.threads == 0


def test_a_retention_dry_run_counts_and_deletes_nothing(
    mem: RedisConversationMemory, owner: str, events: Events
) -> None:
    old = [aged(mem, owner, 2, 12), aged(mem, owner, 4, 9)]
    fresh = aged(mem, owner, 3, 2)

    dry = apply_retention(memory=mem, now=EPOCH, days=7, dry_run=True)

    assert (dry.enabled, dry.dry_run) == (True, True)
    assert (dry.deleted.threads, dry.deleted.turns) == (2, 6)
    for tid in [*old, fresh]:
        assert thread_exists(tid) and not has_tombstone(tid) and len(copy_keys(mem, tid)) == 2
    (run,) = of_kind(events(), MEMORY_RETENTION_RUN)
    assert (run["threads"], run["turns"], run["dry_run"]) == ("2", "6", "True")
    assert of_kind(events(), MEMORY_THREAD_DELETED) == []

    real = apply_retention(memory=mem, now=EPOCH, days=7)  # what the dry run announced
    assert (real.deleted.threads, real.deleted.turns) == (2, 6)
    assert thread_exists(fresh) and not any(thread_exists(t) for t in old)


def test_retention_without_a_window_is_disabled(mem: RedisConversationMemory, owner: str) -> None:
    assert mem.settings.memory_retention_days is None
    tid = aged(mem, owner, 2, 3650)

    result = apply_retention(memory=mem, now=EPOCH)

    assert (result.enabled, result.cutoff, result.deleted) == (False, None, PurgeReport())
    assert thread_exists(tid) and turn_count(tid) == 2
    delete_thread(tid, owner, memory=mem)  # leave nothing this old for other tests


@pytest.mark.parametrize("days", [0, -1, float("nan"), 36_501])
def test_retention_refuses_a_window_that_would_delete_everything(
    mem: RedisConversationMemory, owner: str, days: float
) -> None:
    tid = new_thread(mem, owner, 1)

    with pytest.raises(ValueError, match="retention days"):
        apply_retention(memory=mem, days=days)
    with pytest.raises(ValueError, match="timezone-aware"):
        apply_retention(memory=mem, days=1, now=datetime(2030, 1, 1))

    assert [t.id for t in list_threads(owner, memory=mem)] == [tid]
