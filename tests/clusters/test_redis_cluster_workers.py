"""Workers with `REDIS_URL=redis+cluster://...`: finalize jobs and folds on a Redis Cluster.

A worker process (its own settings from the environment, as deployed) saves the turns an agent
enqueued and folds them; the agent's process reads the copies the worker wrote on the
cluster, with the fold's summary in them, and every copy agrees with Postgres.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from memory_core import RedisConversationMemory, enqueue_turn
from memory_core.devservices.poll import wait_for
from memory_core.devservices.redis_cluster import ClusterServer
from memory_core.devservices.workers import WorkerProcess
from tests.support.snapshots import make_snapshot
from tests.support.state import count_stored, folds_behind, settle_folds, stale_copies

OWNER = "user-42"
TURNS = 24  # past the compression threshold (20): each thread folds once


def test_a_worker_on_the_cluster_saves_and_folds_and_the_copies_agree_with_postgres(
    redis_cluster: ClusterServer,
    cluster_memory: RedisConversationMemory,
    broker: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    worker = start_worker(env={"REDIS_URL": redis_cluster.url})
    tids = [uuid.uuid4() for _ in range(3)]
    for n in range(1, TURNS + 1):
        for tid in tids:
            out = enqueue_turn(make_snapshot(tid, n), memory=cluster_memory, broker_url=broker)
            assert out.status == "enqueued", out
    wait_for(lambda: count_stored(tids) == TURNS * len(tids), 120, "the turns", worker.log)
    settle_folds(tids, 120, lambda: folds_behind(tids) + worker.log())

    for tid in tids:
        # Before any read of this process (a read would rebuild a missing copy): the worker
        # wrote the copy on the cluster, and its fold carried the summary into it.
        meta, turns = cluster_memory.copy.read(tid)
        assert meta.get(b"summary") and len(turns) > 0, tid
        ctx = cluster_memory.get_context(tid, OWNER)
        assert ctx.summary and ctx.summary_through_seq > 0
        assert ctx.recent[-1].seq == TURNS
    assert stale_copies(tids, cluster_memory) == []
