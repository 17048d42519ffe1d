"""memory_core.devservices.redis_cluster: a private Redis Cluster of six local processes.

Its shape (three primaries holding all slots, a replica in sync on each, loopback only), reuse
of a running one, a primary killed -9 with its replica taking over, and a stop that leaves no
node running. The tests share one cluster and run in file order: the failover comes last but
one, the stop last.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from memory_core.devservices import ensure_services, redis_cluster
from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.redis_cluster import (
    HOST,
    SLOTS,
    ClusterServer,
    cluster_ok,
    running_nodes,
    start_redis_cluster,
    stop_redis_cluster,
)
from memory_core.devservices.system import DevServicesError, alive
from memory_core.settings import get_settings

pytestmark = pytest.mark.workers  # private servers, as the RabbitMQ node tests
NODE_TIMEOUT_MS = 1000  # a replica takes over about this long after its primary stops


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="module")
def cluster(data_dir: Path) -> Iterator[ClusterServer]:
    server = start_redis_cluster(data_dir, node_timeout_ms=NODE_TIMEOUT_MS)
    yield server
    stop_redis_cluster(data_dir)


def _client(cluster: ClusterServer) -> RedisCluster:
    seeds = [ClusterNode(HOST, p) for p in cluster.ports]
    # Retries with a backoff ride out the failover (the client re-reads the slots on MOVED).
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)
    return RedisCluster(startup_nodes=seeds, socket_timeout=2, retry=retry)


def _role(port: int) -> dict[str, object]:
    with redis.Redis(HOST, port, socket_timeout=2) as node:
        return dict(node.info("replication"))


def test_three_primaries_hold_every_slot_each_with_a_replica_in_sync(
    cluster: ClusterServer,
) -> None:
    assert len(cluster.primaries) == len(cluster.replicas) == 3
    with redis.Redis(HOST, cluster.primaries[0], socket_timeout=2) as node:
        slots = node.execute_command("CLUSTER SLOTS")
    owners = {(int(s[2][1])): int(s[1]) - int(s[0]) + 1 for s in slots}
    assert set(owners) == set(cluster.primaries) and sum(owners.values()) == SLOTS
    for primary, replica in zip(cluster.primaries, cluster.replicas, strict=True):
        assert _role(primary)["role"] == "master"
        info = _role(replica)
        assert (info["role"], info["master_port"], info["master_link_status"]) == (
            "slave",
            primary,
            "up",
        )
    assert cluster.url == "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in cluster.ports)


def test_every_node_listens_on_loopback_only(cluster: ClusterServer) -> None:
    for port in cluster.ports:
        with redis.Redis(HOST, port, socket_timeout=2) as node:
            assert node.config_get("bind") == {"bind": "127.0.0.1"}
            bus = int(node.config_get("cluster-port")["cluster-port"])
        assert 0 < bus < 65536 and bus != port


def test_a_cluster_client_reads_and_writes_on_every_primary(cluster: ClusterServer) -> None:
    client = _client(cluster)
    keys = [f"thread:{{t{n}}}:copy" for n in range(60)]
    for n, key in enumerate(keys):
        client.set(key, n)
    served = {client.get_node_from_key(k).port for k in keys}
    assert served == set(cluster.primaries)
    assert [client.get(k) for k in keys] == [str(n).encode() for n in range(60)]
    client.close()


def test_a_running_cluster_is_reused_not_restarted(data_dir: Path, cluster: ClusterServer) -> None:
    again = start_redis_cluster(data_dir)
    assert again.stop is None and again.ports == cluster.ports
    assert "already running" in again.note
    assert [again.pid(p) for p in again.ports] == [cluster.pid(p) for p in cluster.ports]


def test_ensure_services_keeps_a_cluster_url_and_refuses_a_dead_one(
    tmp_path: Path, cluster: ClusterServer
) -> None:
    """A `redis+cluster://` REDIS_URL is a choice: kept when the cluster answers (the demo
    then runs on it), one line naming the fix when it does not, never a private stand-in."""
    database_url = get_settings().database_url
    services = ensure_services(database_url, cluster.url, tmp_path)
    assert services.redis_url == cluster.url and not services.started
    dead = f"redis+cluster://127.0.0.1:{free_port()}"
    with pytest.raises(DevServicesError, match=r"does not answer .*--redis-cluster"):
        ensure_services(database_url, dead, tmp_path)


def test_a_primary_killed_minus_9_hands_its_slots_to_its_replica(cluster: ClusterServer) -> None:
    client = _client(cluster)
    victim, heir = cluster.primaries[0], cluster.replicas[0]
    key = next(f"k{n}" for n in range(10_000) if client.get_node_from_key(f"k{n}").port == victim)
    client.set(key, "before")
    with redis.Redis(HOST, victim, socket_timeout=2) as node:
        assert node.execute_command("WAIT", 1, 2000) == 1  # the replica has it
    os.kill(cluster.pid(victim), signal.SIGKILL)
    survivors = [p for p in cluster.ports if p != victim]
    wait_for(
        lambda: _role(heir)["role"] == "master" and cluster_ok(survivors),
        30,
        "the replica to take over the killed primary's slots",
    )
    assert client.get(key) == b"before"
    client.set(key, "after")
    assert client.get(key) == b"after" and client.get_node_from_key(key).port == heir
    assert running_nodes(cluster) == survivors
    client.close()


def test_stop_ends_every_node(data_dir: Path, cluster: ClusterServer) -> None:
    pids = [cluster.pid(p) for p in cluster.ports]
    stop_redis_cluster(data_dir)
    assert not any(alive(pid) for pid in pids) and running_nodes(cluster) == []
    assert not (data_dir / "redis-cluster" / "ports").exists()
    stop_redis_cluster(data_dir)  # twice: nothing to do, no error


def test_the_command_starts_a_cluster_and_stop_ends_it(tmp_path: Path) -> None:
    """`python -m memory_core.devservices --redis-cluster`, then `--stop`."""
    command = [sys.executable, "-m", "memory_core.devservices", "--data-dir", str(tmp_path)]
    started = subprocess.run(
        [*command, "--redis-cluster"], capture_output=True, text=True, timeout=120, check=False
    )
    assert started.returncode == 0, started.stderr
    exports = dict(
        line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines()
    )
    assert exports["REDIS_URL"].startswith("redis+cluster://")  # the copies on the cluster
    assert exports["CELERY_BROKER_URL"].startswith("redis://")  # Celery's on one server
    seeds = exports["REDIS_URL"].removeprefix("redis+cluster://").split(",")
    ports = [int(s.rpartition(":")[2]) for s in seeds]
    assert len(ports) == 6 and all(s.startswith("127.0.0.1:") for s in seeds)
    assert cluster_ok(ports)
    pids = [int((tmp_path / "redis-cluster" / str(p) / "redis.pid").read_text()) for p in ports]
    # Run again with that REDIS_URL: the cluster answers, it is used, not started anew.
    env = {**os.environ, **exports}
    again = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert again.returncode == 0, again.stderr
    assert f"export REDIS_URL={exports['REDIS_URL']}" in again.stdout
    assert (
        "Redis Cluster answers at" in again.stderr
        and "started private Redis Cluster" not in again.stderr
    )
    stopped = subprocess.run([*command, "--stop"], capture_output=True, timeout=60, check=False)
    assert stopped.returncode == 0 and not any(alive(pid) for pid in pids)


def test_a_port_another_process_answers_on_is_formed_again_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clusters formed at once (xdist workers) may draw the same free port: the node that
    lost the race exits, and the other cluster's node answers in its place. Formation notices
    (pid file against the answering server's pid) and starts again on fresh ports, instead of
    configuring a stranger's node ("Node config epoch is already non-zero")."""
    stranger = redis.Redis.from_url(get_settings().redis_url)  # the session's Redis: not ours
    taken = int(stranger.connection_pool.connection_kwargs["port"])
    draws: list[list[int]] = []
    real = redis_cluster.free_ports

    def draw(count: int) -> list[int]:
        ports = real(count)
        if not draws:
            ports[1] = taken  # the first formation's second node loses its port
        draws.append(ports)
        return ports

    monkeypatch.setattr(redis_cluster, "free_ports", draw)
    with pytest.raises(redis_cluster.PortTaken):
        redis_cluster._ours(
            tmp_path, taken
        )  # no pid file of ours: the answering server is a stranger
    assert redis_cluster._ours(tmp_path, free_port()) is False  # nothing answers yet
    server = start_redis_cluster(tmp_path, node_timeout_ms=NODE_TIMEOUT_MS)
    try:
        assert len(draws) == 2 and taken not in server.ports
        assert cluster_ok(server.ports)
        assert stranger.ping()  # the stranger was left alone
    finally:
        stop_redis_cluster(tmp_path)
    stranger.close()
