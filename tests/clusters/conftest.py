"""A private Redis Cluster (memory_core/devservices/redis_cluster.py) for the tests of this
folder: three primaries and a replica each, on loopback, one per test process. The settings
and memories built on it name it by `redis+cluster://` seeds, as a deployment would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memory_core import RedisConversationMemory
from memory_core.devservices.redis_cluster import (
    ClusterServer,
    start_redis_cluster,
    stop_redis_cluster,
)
from memory_core.io.redis_client import make_redis
from memory_core.settings import Settings, get_settings

NODE_TIMEOUT_MS = 1000  # a replica takes over about this long after its primary stops


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    data_dir = tmp_path_factory.mktemp("redis-cluster")
    server = start_redis_cluster(data_dir, node_timeout_ms=NODE_TIMEOUT_MS)
    yield server
    stop_redis_cluster(data_dir)


@pytest.fixture
def cluster_settings(redis_cluster: ClusterServer) -> Settings:
    return get_settings().model_copy(update={"redis_url": redis_cluster.url})


@pytest.fixture
def cluster_memory(cluster_settings: Settings) -> Iterator[RedisConversationMemory]:
    client = make_redis(cluster_settings.redis_url)
    yield RedisConversationMemory(client, settings=cluster_settings)
    client.close()
