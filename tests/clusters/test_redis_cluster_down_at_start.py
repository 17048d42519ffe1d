"""A process that starts while its Redis Cluster is down (every node stopped).

redis-py's `RedisCluster` asks the seeds for the slot map when it is built and raises when
none answers; a plain `redis.Redis` connects on its first command. The library builds its
cluster clients deferred (memory_core.io.redis_client.DeferredRedisCluster), so the memory of
an agent or a worker that starts during a cluster outage is built, its saves answer `saved`
without the copy, its reads come complete from Postgres, and once the nodes are back the copy
serves again: the same outcomes as a single Redis that is down.
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest
from redis.cluster import RedisCluster

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.poll import wait_for
from memory_core.devservices.redis_cluster import (
    ClusterServer,
    cluster_ok,
    restart_node,
    running_nodes,
)
from memory_core.io.redis_client import make_redis
from memory_core.metrics import CACHE_READS
from memory_core.settings import Settings
from tests.support.snapshots import make_snapshot

OWNER = "user-42"


def _hits() -> float:
    return CACHE_READS.labels("hit")._value.get()


@pytest.fixture
def cluster_down(redis_cluster: ClusterServer) -> ClusterServer:
    for port in redis_cluster.ports:
        os.kill(redis_cluster.pid(port), signal.SIGKILL)
    wait_for(lambda: running_nodes(redis_cluster) == [], 10, "every node to be gone")
    return redis_cluster


def test_a_memory_built_while_the_cluster_is_down_saves_reads_and_heals(
    cluster_down: ClusterServer, cluster_settings: Settings
) -> None:
    client = make_redis(cluster_settings.redis_url)  # no node answers: it must not raise
    assert isinstance(client, RedisCluster)
    memory = RedisConversationMemory(client, settings=cluster_settings)
    tid = uuid.uuid4()
    for seq in (1, 2):
        out = save_session_to_thread_safe(make_snapshot(tid, seq), memory=memory)
        assert (out.status, out.seq, out.cache) == ("saved", seq, "unavailable")
    before = _hits()
    ctx = memory.get_context(tid, OWNER)
    assert [e.seq for e in ctx.recent] == [1, 2] and _hits() == before  # from Postgres

    for port in cluster_down.ports:
        restart_node(cluster_down, port)
    wait_for(lambda: cluster_ok(cluster_down.ports), 60, "the cluster to be ok again")
    out = save_session_to_thread_safe(make_snapshot(tid, 3), memory=memory)
    assert out.status == "saved" and out.seq == 3
    wait_for(
        lambda: memory.get_context(tid, OWNER).recent[-1].seq == 3 and _hits() > before,
        30,
        "a read served from the copy",
    )
    ctx = memory.get_context(tid, OWNER)
    assert [e.seq for e in ctx.recent] == [1, 2, 3]
    client.close()
