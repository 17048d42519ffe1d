"""Which Redis a `REDIS_URL` names: one server, or a Redis Cluster by its seed nodes, and
the client types of both.

Below both the settings (which check the URL when they load) and the clients (which connect):
everything that takes a Redis client takes either kind (`SyncRedis`, `AsyncRedis`).
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, TypeAlias
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.connection import Encoder

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


class DeferredRedisCluster(RedisCluster):
    """A `RedisCluster` that reads the slot map on first use instead of when it is built.

    redis-py's constructor asks the seeds for the slot map and raises
    `RedisClusterUnreachableError` when none answers, while a plain `redis.Redis` connects on its
    first command. Built this way, a process that starts while the cluster is down (an agent
    building its memory, a worker) still starts: its first command is a cache error like any
    other (a save answers `saved`, a read falls back to Postgres), and the next one tries again.
    """

    def __init__(self, **kwargs: Any) -> None:  # no super().__init__: that is deferred
        self.__dict__["_deferred"] = kwargs
        self.__dict__["_deferred_lock"] = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Reached only for what is not set yet: before the first use, every attribute that
        # RedisCluster.__init__ sets (its methods are found on the class and reach here through
        # them). Other threads wait for the one building it; that one's own lookups inside
        # __init__ are plain misses.
        state = self.__dict__
        if "_deferred" not in state or name.startswith("__"):
            raise AttributeError(name)
        if state.get("_deferred_owner") == threading.get_ident():
            raise AttributeError(name)
        with state["_deferred_lock"]:
            if "_deferred" in state:
                state["_deferred_owner"] = threading.get_ident()
                try:
                    super().__init__(**state["_deferred"])  # raises while no seed answers
                finally:
                    state["_deferred_owner"] = None
                del state["_deferred"]
        return getattr(self, name)

    def close(self) -> None:
        if "_deferred" not in self.__dict__:
            super().close()

    def get_encoder(self) -> Encoder:
        # register_script asks for it when the memory is built: answer from the options.
        kw = self.__dict__.get("_deferred")
        if kw is None:
            return super().get_encoder()
        return Encoder(
            kw.get("encoding", "utf-8"),
            kw.get("encoding_errors", "strict"),
            kw.get("decode_responses", False),
        )


def cluster_startup(client: RedisCluster) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The seed nodes (host, port) and connection options (username, password, ssl) of a
    cluster client, deferred or built, without reaching the cluster."""
    deferred = client.__dict__.get("_deferred")
    if deferred is not None:
        return [(n.host, n.port) for n in deferred["startup_nodes"]], deferred
    manager = client.nodes_manager
    return [(n.host, n.port) for n in manager.startup_nodes.values()], manager.connection_kwargs


def redis_location(client: SyncRedis) -> str:
    """Which copies a client reaches, as a short key (a server and database, or a cluster's
    seed nodes): two memories with equal locations and prefixes read the same copies."""
    if isinstance(client, RedisCluster):
        seeds = sorted(f"{host}:{port}" for host, port in cluster_startup(client)[0])
        return "cluster:" + ",".join(seeds)
    where = client.connection_pool.connection_kwargs
    return f"{where.get('host', where.get('path'))}:{where.get('port')}/{where.get('db')}"
