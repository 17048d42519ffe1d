"""Sync and async interleaved on the same threads: hypothesis drives saves, redeliveries,
reads and copy expiry through either door and either of two memories (two processes: same
Redis keys, own clients and parsed caches), and after every step both doors read the same
context, with the seqs 1..n of the turns saved, in order."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from memory_core import ConversationContext, RedisConversationMemory, ThreadNotFound
from memory_core.io.redis_client import make_redis
from tests.support.api import OWNER, Api, AsyncApi, SyncApi
from tests.support.faults import FaultyRedis
from tests.support.replay import Step, replay, step
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs

THREADS = 3
MAX_TURNS = 6  # below the fold threshold: no fold is ever requested


@dataclass
class ThreadModel:
    tid: uuid.UUID = field(default_factory=uuid.uuid4)
    snapshots: list[dict[str, Any]] = field(default_factory=list)  # seq order


class ParityMachine(RuleBasedStateMachine):
    def __init__(
        self, doors: tuple[SyncApi, AsyncApi], memories: tuple[RedisConversationMemory, ...]
    ) -> None:
        super().__init__()
        self.doors: tuple[Api, Api] = doors
        self.memories = memories
        self.threads = [ThreadModel() for _ in range(THREADS)]

    def door(self, asynchronous: bool) -> Api:
        return self.doors[asynchronous]

    @rule(i=st.integers(0, THREADS - 1), asynchronous=st.booleans(), m=st.integers(0, 1))
    def save(self, i: int, asynchronous: bool, m: int) -> None:
        t = self.threads[i]
        if len(t.snapshots) >= MAX_TURNS:
            return
        n = len(t.snapshots) + 1
        snap = make_snapshot(t.tid, n)
        out = self.door(asynchronous).save(snap, memory=self.memories[m])
        assert (out.status, out.seq, out.thread_id, out.session_id) == (
            "saved",
            n,
            str(t.tid),
            snap["session_id"],
        ), out
        t.snapshots.append(snap)

    @rule(
        i=st.integers(0, THREADS - 1),
        k=st.integers(0, MAX_TURNS - 1),
        asynchronous=st.booleans(),
        m=st.integers(0, 1),
    )
    def redeliver(self, i: int, k: int, asynchronous: bool, m: int) -> None:
        t = self.threads[i]
        if k >= len(t.snapshots):
            return
        out = self.door(asynchronous).save(t.snapshots[k], memory=self.memories[m])
        assert (out.status, out.seq) == ("duplicate", k + 1), out

    @rule(i=st.integers(0, THREADS - 1), asynchronous=st.booleans(), m=st.integers(0, 1))
    def read(self, i: int, asynchronous: bool, m: int) -> None:
        t = self.threads[i]
        door, memory = self.door(asynchronous), self.memories[m]
        if not t.snapshots:
            with pytest.raises(ThreadNotFound):
                door.get_context(memory, t.tid, OWNER)
            return
        self.check(t, door.get_context(memory, t.tid, OWNER))

    @rule(i=st.integers(0, THREADS - 1))
    def copy_expires(self, i: int) -> None:
        self.memories[0].invalidate(self.threads[i].tid)

    @rule(i=st.integers(0, THREADS - 1), asynchronous=st.booleans())
    def a_stranger_reads(self, i: int, asynchronous: bool) -> None:
        t = self.threads[i]
        with pytest.raises(ThreadNotFound) as caught:
            self.door(asynchronous).get_context(self.memories[0], t.tid, "mallory")
        assert str(caught.value) == f"thread {t.tid} not found"

    def check(self, t: ThreadModel, ctx: ConversationContext) -> None:
        assert [e.seq for e in ctx.recent] == list(range(1, len(t.snapshots) + 1))
        assert [str(e.session_id) for e in ctx.recent] == [s["session_id"] for s in t.snapshots]
        assert ctx.missing_session_ids == [] and ctx.summary_through_seq == 0

    @invariant()
    def both_doors_read_the_same_context(self) -> None:
        sync, async_ = self.doors
        for t in self.threads:
            if not t.snapshots:
                continue
            for memory in self.memories:
                got = sync.get_context(memory, t.tid, OWNER)
                assert async_.get_context(memory, t.tid, OWNER) == got
                self.check(t, got)

    @invariant()
    def postgres_holds_contiguous_seqs(self) -> None:
        for t in self.threads:
            assert stored_seqs(t.tid) == list(range(1, len(t.snapshots) + 1))


def test_sync_and_async_interleaved_read_and_write_the_same(
    both: tuple[SyncApi, AsyncApi], redis_client: redis.Redis
) -> None:
    prefix = f"parity{uuid.uuid4().hex[:6]}"
    memories = (
        RedisConversationMemory(redis_client, key_prefix=prefix),
        RedisConversationMemory(redis_client, key_prefix=prefix, local_cache_size=0),
    )
    run_state_machine_as_test(
        # Hypothesis documents "a class or a function" here; its annotation says only a class.
        lambda: ParityMachine(both, memories),  # type: ignore[arg-type]
        settings=settings(
            max_examples=int(os.environ.get("API_PARITY_EXAMPLES", "20")),
            stateful_step_count=int(os.environ.get("API_PARITY_STEPS", "25")),
            deadline=None,
            derandomize="API_PARITY_EXAMPLES" not in os.environ,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


# What the parity machine found, as the steps that show it: e6feb88, a memory given its own
# blocking Redis client built its asyncio client from the settings' URL, so one door wrote a
# copy the other never read.
PINNED: dict[str, list[Step]] = {
    "a_memory_given_clients_reads_through_both_doors_what_either_wrote": [
        step("save", i=0, asynchronous=False, m=0),
        step("read", i=0, asynchronous=True, m=0),
        step("save", i=0, asynchronous=True, m=1),
        step("read", i=0, asynchronous=False, m=1),
        step("copy_expires", i=0),
        step("redeliver", i=0, k=1, asynchronous=True, m=0),
        step("read", i=0, asynchronous=True, m=1),
    ],
}


@pytest.mark.parametrize("steps", PINNED.values(), ids=PINNED.keys())
def test_both_doors_agree_in_the_sequences_that_broke_them(
    both: tuple[SyncApi, AsyncApi],
    redis_client: redis.Redis,
    faulty_redis: FaultyRedis,
    steps: list[Step],
) -> None:
    """The memories are given a client of a Redis other than the settings' one: both doors
    must use it, and the settings' Redis holds nothing of theirs."""
    faulty_redis.up()
    prefix = f"parity{uuid.uuid4().hex[:6]}"
    memories = tuple(
        RedisConversationMemory(make_redis(faulty_redis.url), key_prefix=prefix, local_cache_size=n)
        for n in (4, 0)
    )
    machine = ParityMachine(both, memories)
    replay(machine, steps)
    tid = machine.threads[0].tid
    assert faulty_redis.admin.exists(*memories[0].copy.keys(tid)) == 2
    assert list(redis_client.scan_iter(match=f"*{prefix}*")) == []
