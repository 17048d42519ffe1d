"""`FaultyCluster`: the faults of a Redis Cluster, switched on and off by a test, on a private
cluster (memory_core/devservices/redis_cluster.py).

- `kill_primary(key)`: kill -9 the primary that holds `key`'s slot; its replica takes over
  after the node timeout, and until then the slot has no primary (CLUSTERDOWN, connection
  refused). One node at a time: a second kill waits for `up()`.
- `start_migration(key)`: begin moving `key`'s slot to another primary (IMPORTING, MIGRATING)
  and move the first of its keys: the slot's keys are on two nodes (ASK, TRYAGAIN).
- `up()`: finish a migration, restart a killed node (it rejoins as a replica), and wait until
  every slot is served with every replica in sync.
"""

from __future__ import annotations

import contextlib
import os
import signal

import redis
from redis.cluster import ClusterNode, RedisCluster

from memory_core.devservices.poll import wait_for
from memory_core.devservices.redis_cluster import (
    HOST,
    ClusterServer,
    cluster_ok,
    restart_node,
)

SETTLE_S = 60.0


def _node(port: int) -> redis.Redis:
    return redis.Redis(HOST, port, socket_timeout=5)


def _myid(port: int) -> str:
    with _node(port) as node:
        return str(node.execute_command("CLUSTER MYID").decode())


class FaultyCluster:
    """A private Redis Cluster and its faults (the interface of `FaultyRedis` where the model
    uses it: `url`, `state`, `admin`, `up()`)."""

    def __init__(self, cluster: ClusterServer) -> None:
        self.cluster = cluster
        self.url = cluster.url
        seeds = [ClusterNode(HOST, p) for p in cluster.ports]
        self.admin = RedisCluster(startup_nodes=seeds, socket_timeout=5)
        self.state = "up"
        self.killed: int | None = None
        self.migration: tuple[int, int, int] | None = None  # slot, source, target
        self.kills = self.migrations = 0  # faults injected: a run that had none proves nothing

    def primary_of(self, key: str) -> int:
        for port in self.cluster.ports:
            if port == self.killed:
                continue
            with contextlib.suppress(redis.RedisError), _node(port) as node:
                for first, last, primary, *_ in node.execute_command("CLUSTER SLOTS"):
                    if first <= self.admin.keyslot(key) <= last:
                        return int(primary[1])
        raise AssertionError(f"no node knows the slot of {key}")

    def kill_primary(self, key: str) -> None:
        if self.killed is not None or self.migration is not None:
            return
        port = self.primary_of(key)
        os.kill(self.cluster.pid(port), signal.SIGKILL)
        self.killed, self.state = port, "failover"
        self.kills += 1

    def start_migration(self, key: str) -> None:
        if self.killed is not None or self.migration is not None:
            return
        slot, source = self.admin.keyslot(key), self.primary_of(key)
        target = next(p for p in self._primaries() if p != source)
        with _node(target) as node:
            node.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", _myid(source))
        with _node(source) as node:
            node.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", _myid(target))
            for key_in_slot in node.execute_command("CLUSTER GETKEYSINSLOT", slot, 1):
                node.execute_command("MIGRATE", HOST, target, key_in_slot, 0, 5000)
        self.migration, self.state = (slot, source, target), "migrating"
        self.migrations += 1

    def up(self) -> None:
        if self.migration is not None:
            self._finish_migration(*self.migration)
            self.migration = None
        if self.killed is not None:
            wait_for(lambda: self._taken_over(), SETTLE_S, "a replica to take over")
            restart_node(self.cluster, self.killed)
            self.killed = None
        wait_for(lambda: self._healthy(), SETTLE_S, "the cluster to settle")
        self.admin.nodes_manager.initialize()
        self.state = "up"

    def close(self) -> None:
        self.admin.close()

    # ------------------------------------------------------------------ internals

    def _primaries(self) -> list[int]:
        return [p for p in self.cluster.ports if p != self.killed and self._role(p) == "master"]

    def _role(self, port: int) -> str:
        with contextlib.suppress(redis.RedisError, OSError), _node(port) as node:
            return str(node.info("replication")["role"])
        return "down"

    def _taken_over(self) -> bool:
        """No live node names the killed one as a slot's primary, and every slot is served."""
        live = [p for p in self.cluster.ports if p != self.killed]
        with contextlib.suppress(redis.RedisError, OSError), _node(live[0]) as node:
            primaries = {int(row[2][1]) for row in node.execute_command("CLUSTER SLOTS")}
            return self.killed not in primaries and cluster_ok(live)
        return False

    def _healthy(self) -> bool:
        roles = [self._role(p) for p in self.cluster.ports]
        if roles.count("master") != 3 or roles.count("slave") != 3:
            return False
        for port in self.cluster.ports:
            if self._role(port) == "slave":
                with _node(port) as node:
                    if node.info("replication").get("master_link_status") != "up":
                        return False
        return cluster_ok(self.cluster.ports)

    def _finish_migration(self, slot: int, source: int, target: int) -> None:
        with _node(source) as node:
            while keys := node.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                node.execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", *keys)
        target_id = _myid(target)
        for port in [target, source, *[p for p in self._primaries() if p not in (source, target)]]:
            with _node(port) as node:
                node.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
