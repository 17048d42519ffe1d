"""Redis clients tuned to fail fast: an unreachable cache must degrade to Postgres quickly.

`REDIS_URL` names one server (`redis://`, `rediss://`, `unix://`) or a Redis Cluster by its
seed nodes, `redis+cluster://[user:password@]HOST:PORT[,HOST:PORT...]` (`rediss+cluster://`
with TLS): the client discovers the other nodes and follows the slots as they move. A cluster
has database 0 only, so its URL has no database number. Everything the library sends is
either one key, or keys of one thread (one hash tag: one slot), or a pipeline that the cluster
client splits by node; see docs/ARCHITECTURE.md, "Redis Cluster".
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.retry import Retry

from memory_core.io.redis_kinds import (
    DeferredRedisCluster,
    SyncRedis,
    cluster_seeds,
    is_cluster_url,
)
from memory_core.settings import get_settings

_CLIENTS: dict[str, SyncRedis] = {}


def make_redis(url: str, *, socket_timeout: float = 2.0) -> SyncRedis:
    # One quick retry covers a stale pooled connection after a Redis restart; more would only
    # delay the fallback to Postgres. Never after a timeout: a Redis that hangs costs one
    # socket timeout per call, not two or four (tests/test_core_faults_hostile.py).
    retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    if is_cluster_url(url):
        found = cluster_seeds(url)
        return DeferredRedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in found.seeds],
            socket_connect_timeout=1.0,
            socket_timeout=socket_timeout,
            health_check_interval=30,
            retry=retry,  # redirects (MOVED, ASK) are followed apart from it
            decode_responses=False,
            username=found.username,
            password=found.password,
            ssl=found.ssl,
        )
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=1.0,
        socket_timeout=socket_timeout,
        health_check_interval=30,
        retry=retry,
        decode_responses=False,
    )


def get_redis(url: str | None = None) -> SyncRedis:
    url = url or get_settings().redis_url
    if url not in _CLIENTS:
        _CLIENTS[url] = make_redis(url)
    return _CLIENTS[url]


def reset_redis_clients() -> None:
    for client in _CLIENTS.values():
        client.close()
    _CLIENTS.clear()
