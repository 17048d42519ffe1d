"""`bench redis-cluster`: the memory's saves and reads on one Redis server and on a private
Redis Cluster (three primaries, a replica each), in one run on one machine.

One machine cannot show a cluster's scaling: its six nodes share the same cores as the
benchmark. What the ratio shows is the cost of the cluster client (slot routing, a connection
per node, redirects) and of replication to the replicas. Both sides run the same calls: THREADS
threads, TURNS saves each (`save_session_to_thread_safe`, interleaved across threads), then
READS reads per thread (`get_context`, each a round trip to the copy).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from memory_core.bench.common import json_logs_to_devnull, machine, snapshot
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.devservices.redis_cluster import start_redis_cluster
from memory_core.io.redis_client import make_redis
from memory_core.settings import Settings
from memory_core.write.session_handler import save_session_to_thread_safe

OWNER = "bench-cluster"


def _side(
    settings: Settings, url: str, threads: int, turns: int, reads: int
) -> tuple[float, float]:
    """(saves per second, reads per second) of one memory on `url`."""
    client = make_redis(url)
    memory = RedisConversationMemory(
        client,
        settings=settings.model_copy(update={"redis_url": url}),
        key_prefix=f"benchcluster{uuid.uuid4().hex[:6]}",
    )
    tids = [uuid.uuid4() for _ in range(threads)]
    started = time.perf_counter()
    for n in range(1, turns + 1):
        for tid in tids:
            out = save_session_to_thread_safe(snapshot(tid, n, OWNER), memory=memory)
            if out.status != "saved" or out.cache == "unavailable":
                reason = f"{out.status} ({out.reason}; cache {out.cache})"
                raise RuntimeError(f"a save answered {reason}")
    saves = threads * turns / (time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(reads):
        for tid in tids:
            memory.get_context(tid, OWNER)
    read_rate = threads * reads / (time.perf_counter() - started)
    client.close()
    return saves, read_rate


def bench_redis_cluster(
    *, settings: Settings, data_dir: Path, threads: int = 50, turns: int = 10, reads: int = 10
) -> dict[str, tuple[float, float]]:
    """Print and return {side: (saves/s, reads/s)} for `single` (REDIS_URL) and `cluster`."""
    cluster = start_redis_cluster(data_dir)
    try:
        with json_logs_to_devnull():
            found = {
                "single": _side(settings, settings.redis_url, threads, turns, reads),
                "cluster": _side(settings, cluster.url, threads, turns, reads),
            }
    finally:
        if cluster.stop is not None:
            cluster.stop()
    print(f"agent-memory bench redis-cluster --threads {threads} --turns {turns} --reads {reads}")
    print(f"machine: {machine()}")
    print("side     saves/s   reads/s")
    for side, (saves, read_rate) in found.items():
        print(f"{side:<8} {saves:>7.0f}   {read_rate:>7.0f}")
    single, on_cluster = found["single"], found["cluster"]
    print(
        f"cluster / single: saves {on_cluster[0] / single[0]:.2f}, "
        f"reads {on_cluster[1] / single[1]:.2f} (one machine: the client's and replication's "
        "cost, not a cluster's scaling)"
    )
    return found
