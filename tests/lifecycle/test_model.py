"""A hypothesis state machine: saves, reads, deletes, forgets, archives, expiry, interleaved;
every invariant of a deleted thread checked after every step."""

from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass, field
from functools import partial

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from memory_core import (
    RedisConversationMemory,
    save_session_to_thread_safe,
)
from memory_core.lifecycle.threads import (
    archive_thread,
    delete_thread,
    forget_owner,
    list_threads,
    unarchive_thread,
)
from tests.support.lifecycle import (
    STRANGER,
    gone_key,
    new_thread,
    not_found,
    owners_counts,
    seqs,
    thread_states,
)
from tests.support.snapshots import make_snapshot

# ------------------------------------------------------------------ the model


@dataclass
class ThreadModel:
    tid: uuid.UUID
    owner: str
    turns: list[str] = field(default_factory=list)  # session ids, seq order
    deleted: bool = False
    archived: bool = False

    @property
    def live(self) -> bool:
        return bool(self.turns) and not self.deleted


MAX_TURNS = 6  # below the fold threshold: no fold is ever requested


class LifecycleMachine(RuleBasedStateMachine):
    """Saves, reads, deletes, forgets, archives and copy expiry, against a plain model."""

    def __init__(
        self,
        mem: RedisConversationMemory,
        other: RedisConversationMemory,
        bystander: tuple[str, uuid.UUID],
    ) -> None:
        super().__init__()
        self.mem, self.other = mem, other  # two processes: same Redis keys, own parsed caches
        self.redis = mem.redis
        run = uuid.uuid4().hex[:6]
        self.owners = (f"alice-{run}", f"bob-{run}")
        self.threads = [ThreadModel(uuid.uuid4(), self.owners[i // 2]) for i in range(4)]
        self.bystander = bystander

    def via(self, other: bool) -> RedisConversationMemory:
        return self.other if other else self.mem

    # ---------------------------------------------------------------- rules

    @rule(i=st.integers(0, 3), other=st.booleans())
    def save_turn(self, i: int, other: bool) -> None:
        t = self.threads[i]
        if len(t.turns) >= MAX_TURNS:
            return
        snap = make_snapshot(t.tid, len(t.turns) + 1, owner_id=t.owner)
        out = save_session_to_thread_safe(snap, memory=self.via(other))
        if t.deleted:
            assert (out.status, out.reason, out.retryable) == ("rejected", "deleted", False), out
        else:
            assert (out.status, out.seq) == ("saved", len(t.turns) + 1), out
            t.turns.append(snap["session_id"])

    @rule(i=st.integers(0, 3), other=st.booleans())
    def read(self, i: int, other: bool) -> None:
        self.check_read(self.threads[i], self.via(other))

    @rule(i=st.integers(0, 3), other=st.booleans())
    def delete(self, i: int, other: bool) -> None:
        t = self.threads[i]
        if not t.live:
            not_found(lambda: delete_thread(t.tid, t.owner, memory=self.via(other)), t.tid)
            return
        report = delete_thread(t.tid, t.owner, memory=self.via(other))
        assert (report.threads, report.turns, report.batches) == (1, len(t.turns), 1)
        t.deleted = True

    @rule(i=st.integers(0, 3))
    def the_other_owner_deletes(self, i: int) -> None:
        t = self.threads[i]
        intruder = self.owners[1 - self.owners.index(t.owner)]
        not_found(lambda: delete_thread(t.tid, intruder, memory=self.mem), t.tid)

    @rule(o=st.integers(0, 1), batch=st.integers(1, 3))
    def forget(self, o: int, batch: int) -> None:
        owner = self.owners[o]
        mine = [t for t in self.threads if t.owner == owner and t.live]
        report = forget_owner(owner, memory=self.mem, batch_size=batch)
        assert report.threads == len(mine)
        assert report.turns == sum(len(t.turns) for t in mine)
        assert report.batches == math.ceil(len(mine) / batch)
        assert report.remaining_threads == 0
        for t in mine:
            t.deleted = True

    @rule(i=st.integers(0, 3), archived=st.booleans())
    def archive(self, i: int, archived: bool) -> None:
        t = self.threads[i]
        action = archive_thread if archived else unarchive_thread
        if not t.live:
            not_found(lambda: action(t.tid, t.owner, memory=self.mem), t.tid)
            return
        action(t.tid, t.owner, memory=self.mem)
        t.archived = archived

    @rule(i=st.integers(0, 3))
    def copy_expires(self, i: int) -> None:
        self.redis.delete(*self.mem.copy.keys(self.threads[i].tid))

    @rule(i=st.integers(0, 3))
    def marker_expires(self, i: int) -> None:
        self.redis.delete(gone_key(self.mem, self.threads[i].tid))

    @rule(i=st.integers(0, 3))
    def delete_during_a_rebuild(self, i: int) -> None:
        """Another process read Postgres to rebuild the copy; the delete lands; it writes."""
        t = self.threads[i]
        if not t.live:
            return
        ctx, last = self.other._load_with_last(t.tid, t.owner)
        delete_thread(t.tid, t.owner, memory=self.mem)
        t.deleted = True
        self.other._store(t.owner, ctx, last)

    @rule(i=st.integers(0, 3), other=st.booleans())
    def a_stranger_reads(self, i: int, other: bool) -> None:
        t = self.threads[i]
        intruder = self.owners[1 - self.owners.index(t.owner)]
        for who in (STRANGER, intruder):
            not_found(partial(self.via(other).get_context, t.tid, who), t.tid)

    # ---------------------------------------------------------------- invariants

    def check_read(self, t: ThreadModel, memory: RedisConversationMemory) -> None:
        if not t.live:
            not_found(lambda: memory.get_context(t.tid, t.owner), t.tid)
            return
        ctx = memory.get_context(t.tid, t.owner)
        assert [str(e.session_id) for e in ctx.recent] == t.turns
        assert [e.seq for e in ctx.recent] == list(range(1, len(t.turns) + 1))

    @invariant()
    def postgres_holds_what_the_model_says(self) -> None:
        state = thread_states([t.tid for t in self.threads])
        for t in self.threads:
            expected = (t.live, len(t.turns) if t.live else 0, t.deleted)
            assert state[t.tid] == expected, (t, state[t.tid])
        counts = owners_counts([*self.owners, self.bystander[0]])
        for owner in self.owners:
            mine = [t for t in self.threads if t.owner == owner and t.live]
            assert counts.get(owner, (0, 0)) == (len(mine), sum(len(t.turns) for t in mine))
        assert counts[self.bystander[0]] == (1, 3), "another owner's thread was touched"

    @invariant()
    def deleted_threads_are_never_readable_and_have_no_copy(self) -> None:
        for t in self.threads:
            if t.deleted:
                for memory in (self.mem, self.other):
                    not_found(partial(memory.get_context, t.tid, t.owner), t.tid)
                assert self.redis.exists(*self.mem.copy.keys(t.tid)) == 0, "a deleted copy"

    @invariant()
    def live_threads_read_what_was_saved(self) -> None:
        for t in self.threads:
            if t.live:
                self.check_read(t, self.mem)

    @invariant()
    def history_lists_the_live_threads(self) -> None:
        for owner in self.owners:
            mine = {t.tid: t for t in self.threads if t.owner == owner and t.live}
            every = list_threads(owner, include_archived=True, memory=self.mem)
            assert {i.id: (i.turns, i.is_archived) for i in every} == {
                tid: (len(t.turns), t.archived) for tid, t in mine.items()
            }
            shown = {i.id for i in list_threads(owner, memory=self.mem)}
            assert shown == {tid for tid, t in mine.items() if not t.archived}


def test_deleted_threads_never_come_back_under_interleaved_operations(
    mem: RedisConversationMemory, other_process: RedisConversationMemory
) -> None:
    bystander = f"bystander-{uuid.uuid4().hex[:8]}"
    theirs = new_thread(mem, bystander, 3)
    run_state_machine_as_test(
        # Hypothesis documents "a class or a function" here; its annotation says only a class.
        lambda: LifecycleMachine(mem, other_process, (bystander, theirs)),  # type: ignore[arg-type]
        settings=settings(
            max_examples=int(os.environ.get("LIFECYCLE_MODEL_EXAMPLES", "20")),
            stateful_step_count=int(os.environ.get("LIFECYCLE_MODEL_STEPS", "30")),
            deadline=None,
            derandomize="LIFECYCLE_MODEL_EXAMPLES" not in os.environ,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert seqs(mem, theirs, bystander) == [1, 2, 3]
