"""Which Redis a `REDIS_URL` names: one server, or a Redis Cluster by its seed nodes, and
the client types of both.

Below both the settings (which check the URL when they load) and the clients (which connect):
everything that takes a Redis client takes either kind (`SyncRedis`, `AsyncRedis`).
"""

from __future__ import annotations

from typing import NamedTuple, TypeAlias
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

SyncRedis: TypeAlias = redis.Redis | RedisCluster
AsyncRedis: TypeAlias = aredis.Redis | AsyncRedisCluster

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


class ClusterURL(NamedTuple):
    seeds: list[tuple[str, int]]
    username: str | None = None
    password: str | None = None
    ssl: bool = False


def cluster_seeds(url: str) -> ClusterURL:
    """The seed nodes of a `redis+cluster://` URL, and the connection options it carries
    (credentials, TLS). ValueError naming what is wrong, without the password."""
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"not a Redis Cluster URL ({'/'.join(CLUSTER_SCHEMES)}://)")
    if parts.path not in ("", "/", "/0") or parts.query or parts.fragment:
        raise ValueError("a Redis Cluster URL names seed nodes only: database 0, no options")
    auth, _, hosts = parts.netloc.rpartition("@")
    seeds: list[tuple[str, int]] = []
    for seed in hosts.split(","):
        host, sep, port = seed.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"a Redis Cluster seed must be HOST:PORT, not {seed.strip()!r}")
        seeds.append((host.strip("[]"), int(port)))
    user, _, password = auth.partition(":")
    tls = parts.scheme.startswith("rediss")
    return ClusterURL(seeds, unquote(user) or None, unquote(password) or None, tls)


def redis_location(client: SyncRedis) -> str:
    """Which copies a client reaches, as a short key (a server and database, or a cluster's
    seed nodes): two memories with equal locations and prefixes read the same copies."""
    if isinstance(client, RedisCluster):
        seeds = sorted(f"{n.host}:{n.port}" for n in client.nodes_manager.startup_nodes.values())
        return "cluster:" + ",".join(seeds)
    where = client.connection_pool.connection_kwargs
    return f"{where.get('host', where.get('path'))}:{where.get('port')}/{where.get('db')}"
