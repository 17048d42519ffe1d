"""A thread's slot moved to another primary while the memory saves and reads it (issue 32).

The slot is migrated by hand, key by key, as `redis-cli --cluster reshard` does (IMPORTING on
the target, MIGRATING on the source, MIGRATE, then SETSLOT NODE everywhere), with a save and a
read between every two steps. In the middle the thread's keys are on two nodes: the client
gets ASK (a key already moved) or TRYAGAIN (a script's keys split). The documented outcomes:
a save never raises and answers `saved`; a read is complete (from the copy or from Postgres);
once the slot has moved, reads come from the copy on the new node and it agrees with Postgres.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import redis
from redis.cluster import RedisCluster

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.redis_cluster import HOST, ClusterServer
from memory_core.metrics import CACHE_READS
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs

OWNER = "user-42"


def _node(port: int) -> redis.Redis:
    return redis.Redis(HOST, port, socket_timeout=5)


def _steps(slot: int, source: int, target: int, primaries: list[int]) -> list[Callable[[], None]]:
    """The migration of `slot` as single steps, each leaving the cluster in a state a client
    must cope with."""
    src_id = _node(source).execute_command("CLUSTER MYID").decode()
    dst_id = _node(target).execute_command("CLUSTER MYID").decode()

    def importing() -> None:
        _node(target).execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)

    def migrating() -> None:
        _node(source).execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)

    def move_one_key() -> None:
        keys = _node(source).execute_command("CLUSTER GETKEYSINSLOT", slot, 1)
        for key in keys:
            _node(source).execute_command("MIGRATE", HOST, target, key, 0, 5000)

    def assign() -> None:
        for port in [target, source, *[p for p in primaries if p not in (source, target)]]:
            _node(port).execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)

    return [importing, migrating, move_one_key, move_one_key, move_one_key, assign]


def _hits() -> float:
    return CACHE_READS.labels("hit")._value.get()


def test_a_slot_moved_under_saves_and_reads_loses_nothing_and_the_copy_follows(
    redis_cluster: ClusterServer, cluster_memory: RedisConversationMemory
) -> None:
    client = cluster_memory.redis
    assert isinstance(client, RedisCluster)
    tid = uuid.uuid4()
    meta_key = cluster_memory.copy.keys(tid)[0]
    slot = client.keyslot(meta_key)
    source = int(client.get_node_from_key(meta_key).port)
    target = next(p for p in redis_cluster.primaries if p != source)
    seq = 0

    def save_and_read() -> str:
        nonlocal seq
        seq += 1
        out = save_session_to_thread_safe(make_snapshot(tid, seq), memory=cluster_memory)
        assert out.status == "saved" and out.seq == seq, out  # never raises, never lost
        ctx = cluster_memory.get_context(tid, OWNER)
        assert ctx.recent[-1].seq == seq  # complete, from wherever it came
        return str(out.cache)

    for _ in range(3):
        save_and_read()
    outcomes = []
    for step in _steps(slot, source, target, redis_cluster.primaries):
        step()
        outcomes.append(save_and_read())
        outcomes.append(save_and_read())

    assert int(_node(target).execute_command("CLUSTER COUNTKEYSINSLOT", slot)) >= 2
    assert int(_node(source).execute_command("CLUSTER COUNTKEYSINSLOT", slot)) == 0
    save_and_read()  # the first use after the move drops a copy marked behind, if any
    before = _hits()
    save_and_read()
    assert _hits() == before + 1  # read from the copy, on its new node
    meta, turns = cluster_memory.copy.read(tid)
    assert meta and sorted(json.loads(t)["seq"] for t in turns) == stored_seqs(tid)
    assert int(client.get_node_from_key(meta_key).port) == target
    print(f"\nresharding: cache outcomes of the saves during the move: {outcomes}")
