"""The memory on a Redis Cluster (`REDIS_URL=redis+cluster://...`): the copy, read-your-writes,
the lifecycle and the events, through the blocking and the asyncio doors.

Each promise is the one the single-server suite holds; what a cluster adds is that a
thread's keys live in one slot of one node, different threads on different nodes, and that
the client must follow them there. The threads of a test are made to span all three
primaries, so a batch that is not split by slot would fail with CROSSSLOT.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from redis.cluster import RedisCluster

from memory_core import (
    RedisConversationMemory,
    ThreadNotFound,
    asave_session_to_thread_safe,
    delete_thread,
    forget_owner,
    save_session_to_thread_safe,
)
from memory_core.events.consumer import EventConsumer
from memory_core.events.stream import MEMORY_THREAD_DELETED, emit_event
from memory_core.io.redis_client import make_redis
from memory_core.io.redis_kinds import redis_location
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs

OWNER = "user-42"


def _cluster(memory: RedisConversationMemory) -> RedisCluster:
    assert isinstance(memory.redis, RedisCluster)
    return memory.redis


def _primaries_of(memory: RedisConversationMemory, tids: list[uuid.UUID]) -> set[str]:
    """The primaries that hold these threads' copies."""
    client = _cluster(memory)
    nodes = {client.get_node_from_key(memory.copy.keys(t)[0]).name for t in tids}
    return nodes


def _spread_threads(memory: RedisConversationMemory, n: int) -> list[uuid.UUID]:
    """`n` fresh thread ids whose copies live on every primary of the cluster."""
    while True:
        tids = [uuid.uuid4() for _ in range(n)]
        if len(_primaries_of(memory, tids)) == 3:
            return tids


def _save(memory: RedisConversationMemory, tid: uuid.UUID, n: int, owner: str = OWNER) -> None:
    out = save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=memory)
    assert out.ok and out.status == "saved", out


def test_a_thread_keys_share_one_slot_and_threads_spread_over_the_primaries(
    cluster_memory: RedisConversationMemory,
) -> None:
    client = _cluster(cluster_memory)
    tids = _spread_threads(cluster_memory, 6)
    for tid in tids:
        keys = [*cluster_memory.copy.write_keys(tid), cluster_memory.copy.saved_channel(tid)]
        assert len({client.keyslot(k) for k in keys}) == 1, keys
    assert redis_location(client).startswith("cluster:")


def test_saves_and_reads_go_through_the_copy_on_the_node_of_each_thread(
    cluster_memory: RedisConversationMemory,
) -> None:
    tids = _spread_threads(cluster_memory, 4)
    for tid in tids:
        for n in (1, 2, 3):
            _save(cluster_memory, tid, n)
    # Another replica of the service (its own client and parsed cache) reads the copies.
    other = RedisConversationMemory(
        make_redis(cluster_memory.settings.redis_url), settings=cluster_memory.settings
    )
    for tid in tids:
        meta, turns = cluster_memory.copy.read(tid)
        assert meta and len(turns) == 3  # the copy is on the cluster, not only in Postgres
        ctx = other.get_context(tid, OWNER)
        assert [e.seq for e in ctx.recent] == [1, 2, 3] == stored_seqs(tid)
        with pytest.raises(ThreadNotFound):  # the owner check holds on the cluster too
            other.get_context(tid, "someone-else")


def test_the_asyncio_door_reads_and_writes_the_same_copies(
    cluster_memory: RedisConversationMemory,
) -> None:
    tids = _spread_threads(cluster_memory, 3)

    async def scenario() -> list[list[int]]:
        for tid in tids:
            for n in (1, 2):
                snap = make_snapshot(tid, n)
                out = await asave_session_to_thread_safe(snap, memory=cluster_memory)
                assert out.status == "saved", out
        seqs = [[e.seq for e in (await cluster_memory.aget_context(t, OWNER)).recent] for t in tids]
        await cluster_memory.aclose()
        return seqs

    assert asyncio.run(scenario()) == [[1, 2]] * 3
    for tid in tids:  # what the asyncio side wrote, the blocking side finds in the copy
        assert len(cluster_memory.copy.read(tid)[1]) == 2
        assert [e.seq for e in cluster_memory.get_context(tid, OWNER).recent] == [1, 2]


def test_a_read_waiting_for_a_turn_is_woken_by_the_save_on_the_thread_node(
    cluster_memory: RedisConversationMemory,
) -> None:
    """Read-your-writes: the waiting read subscribes to the thread's channel (the client picks
    the node of its slot); the save's PUBLISH reaches it across the cluster bus."""
    tid = uuid.uuid4()
    _save(cluster_memory, tid, 1)
    snap = make_snapshot(tid, 2)

    async def scenario() -> list[int]:
        read = asyncio.create_task(
            cluster_memory.aget_context(tid, OWNER, wait_for=snap["session_id"], wait_s=60)
        )
        await asyncio.sleep(0.2)  # the read is subscribed and waiting (it may be earlier)
        assert not read.done()
        await asave_session_to_thread_safe(snap, memory=cluster_memory)
        ctx = await read
        await cluster_memory.aclose()
        return [e.seq for e in ctx.recent]

    assert asyncio.run(scenario()) == [1, 2]
    waited = cluster_memory.get_context(tid, OWNER, wait_for=snap["session_id"], wait_s=60)
    assert [e.seq for e in waited.recent] == [1, 2]


def test_delete_and_forget_owner_purge_copies_on_every_node_and_refuse_late_writes(
    cluster_memory: RedisConversationMemory,
) -> None:
    owner = f"owner-{uuid.uuid4().hex[:8]}"
    tids = _spread_threads(cluster_memory, 9)
    for tid in tids:
        _save(cluster_memory, tid, 1, owner)
    one, rest = tids[0], tids[1:]
    turn = cluster_memory.get_context(one, owner).recent[0]  # to replay as a late write
    assert delete_thread(one, owner, memory=cluster_memory).copies == 1
    # Batches of 3 threads: each batch's copies and markers span slots and nodes.
    report = forget_owner(owner, memory=cluster_memory, batch_size=3)
    assert (report.threads, report.copies, report.remaining_threads) == (len(rest), len(rest), 0)
    client = _cluster(cluster_memory)
    for tid in tids:
        meta, _, gone = cluster_memory.copy.write_keys(tid)
        assert not client.exists(meta) and client.exists(gone), tid
        assert stored_seqs(tid) == []
        # A save that raced the delete cannot bring the copy back.
        assert cluster_memory.copy.append(tid, owner, 0, turn) == "gone"
        assert not client.exists(meta)


def test_events_are_emitted_read_and_acknowledged_through_a_consumer_group(
    cluster_memory: RedisConversationMemory,
) -> None:
    stream = f"memory:events:test-{uuid.uuid4().hex[:8]}"
    client = _cluster(cluster_memory)
    consumer = EventConsumer(client, "ops", "c1", stream=stream, retry_after_ms=0)
    assert consumer.ensure_group()
    tids = [str(uuid.uuid4()) for _ in range(5)]
    for tid in tids:
        emit_event(client, MEMORY_THREAD_DELETED, thread_id=tid, stream=stream)
    first = consumer.read(count=3)
    assert consumer.ack(*(e.id for e in first)) == 3
    rest = consumer.read(count=10)
    assert [e.thread_id for e in [*first, *rest]] == tids
    # Unacknowledged entries are taken over by another consumer of the group.
    again = EventConsumer(client, "ops", "c2", stream=stream).claim_stale(0)
    assert [e.id for e in again] == [e.id for e in rest]


def test_an_event_delivered_too_often_is_dead_lettered_on_whichever_node_holds_that_stream(
    cluster_memory: RedisConversationMemory,
) -> None:
    stream = f"memory:events:test-{uuid.uuid4().hex[:8]}"
    client = _cluster(cluster_memory)
    consumer = EventConsumer(client, "ops", "c1", stream=stream, max_deliveries=1, retry_after_ms=0)
    consumer.ensure_group()
    tid = str(uuid.uuid4())
    emit_event(client, MEMORY_THREAD_DELETED, thread_id=tid, stream=stream)
    assert [e.thread_id for e in consumer.read()] == [tid]  # delivered, never acknowledged
    assert consumer.read() == []  # the second delivery is over the limit
    dead: Any = client.xrange(consumer.dead_letter_stream)
    assert [f[b"thread_id"].decode() for _, f in dead] == [tid]
    assert client.xpending(stream, "ops")["pending"] == 0  # and acknowledged on its stream
