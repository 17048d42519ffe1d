"""A Redis Cluster primary killed -9 while the memory saves and reads (issue 32).

The documented outcomes (docs/RELIABILITY.md, "Redis Cluster"): a save never raises and
answers `saved` (its `cache` says whether the copy took it); a read whose slot has no primary
falls back to Postgres and is still complete; once the replica has taken over, reads come from
the copy again, and no copy differs from Postgres. The figures it measures are printed (run
with `-s`) and quoted in docs/RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import redis
from redis.cluster import RedisCluster

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.redis_cluster import HOST, ClusterServer, cluster_ok
from memory_core.metrics import CACHE_READS
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs

OWNER = "user-42"
SETTLE_ROUNDS = 3  # rounds of saves and reads once the replica has taken over


def _hits() -> float:
    return CACHE_READS.labels("hit")._value.get()


def taken_over(port: int) -> bool:
    """The replica on `port` is a primary now (the cluster's failover is done)."""
    with redis.Redis(HOST, port, socket_timeout=2) as node:
        return bool(node.info("replication")["role"] == "master")


def _copy_seqs(memory: RedisConversationMemory, tid: uuid.UUID) -> list[int] | None:
    meta, turns = memory.copy.read(tid)
    return sorted(json.loads(t)["seq"] for t in turns) if meta else None


def _agrees(copy: list[int] | None, stored: list[int]) -> bool:
    """No copy, or the newest turns Postgres holds, none missing (a copy keeps at most
    MEMORY_MAX_UNFOLDED_MESSAGES of them; no fold runs here)."""
    return copy is None or (bool(copy) and copy == stored[-len(copy) :])


def test_a_primary_killed_during_saves_and_reads_loses_nothing_and_the_copies_heal(
    redis_cluster: ClusterServer, cluster_memory: RedisConversationMemory
) -> None:
    client = cluster_memory.redis
    assert isinstance(client, RedisCluster)
    victim, heir = redis_cluster.primaries[0], redis_cluster.replicas[0]
    tids = [uuid.uuid4() for _ in range(12)]
    on_victim = [
        t for t in tids if client.get_node_from_key(cluster_memory.copy.keys(t)[0]).port == victim
    ]
    while not on_victim:  # at least one thread on the node that dies
        t = uuid.uuid4()
        if client.get_node_from_key(cluster_memory.copy.keys(t)[0]).port == victim:
            tids.append(t)
            on_victim.append(t)
    seq = dict.fromkeys(tids, 0)

    def round_of_saves_and_reads() -> tuple[int, int]:
        """One save and one read per thread: (saves without the copy, reads from the copy of
        the victim's threads)."""
        uncached, hits_on_victim = 0, 0
        for tid in tids:
            seq[tid] += 1
            snap = make_snapshot(tid, seq[tid])
            out = save_session_to_thread_safe(snap, memory=cluster_memory)  # never raises
            assert out.status == "saved" and out.seq == seq[tid], out
            uncached += out.cache == "unavailable"
            before = _hits()
            ctx = cluster_memory.get_context(tid, OWNER)
            assert ctx.recent[-1].seq == seq[tid]  # complete, from the copy or from Postgres
            hits_on_victim += tid in on_victim and _hits() > before
        return uncached, hits_on_victim

    round_of_saves_and_reads()
    killed = time.monotonic()
    os.kill(redis_cluster.pid(victim), signal.SIGKILL)
    survivors = [p for p in redis_cluster.ports if p != victim]
    uncached_saves, rounds, back_after = 0, 0, None
    settled = 0
    while settled < SETTLE_ROUNDS:
        uncached, hits = round_of_saves_and_reads()
        uncached_saves += uncached
        rounds += 1
        if hits == len(on_victim) and back_after is None and rounds > 1:
            back_after = time.monotonic() - killed
        settled += taken_over(heir) and cluster_ok(survivors)
        assert time.monotonic() - killed < 120, "the cluster did not settle"
    assert back_after is not None, "reads of the victim's threads never came back to the copy"

    differ = [t for t in tids if not _agrees(_copy_seqs(cluster_memory, t), stored_seqs(t))]
    assert differ == []
    print(
        f"\nredis cluster failover: {rounds} rounds x {len(tids)} threads, "
        f"{uncached_saves} saves answered saved without the copy, reads from the copy again "
        f"{back_after:.1f} s after the kill, {len(differ)} copies differ from Postgres"
    )
