"""A private RabbitMQ cluster for development and tests: three nodes on 127.0.0.1.

Each node is a `PrivateRabbitMQ` (its own name, AMQP port, data dir and logs) under
`data_dir/rabbitmq-cluster/node<i>/`. They share an Erlang cookie: every node's HOME is its own
directory, and the same `.erlang.cookie` (mode 0400) is written there before its first start,
so the nodes and the rabbitmqctl run against each of them all agree. Nodes 2.. join node 1
(`stop_app`, `join_cluster`, `start_app`). AMQP and Erlang distribution listen on 127.0.0.1
only; a node that has to start epmd starts it on 127.0.0.1 (`ERL_EPMD_ADDRESS`), else the
machine's epmd is used. A JSON file in that folder records the nodes' names and ports: a
healthy cluster found there is reused, and `stop_rabbitmq_cluster(data_dir)` finds every node
from it.

`RabbitClusterServer.failover_url` is Celery's broker failover list, `amqp://...//;amqp://...//`.
Quorum queues (RabbitMQ 3.10.8, rabbit_quorum_queue:start_cluster/1 and
rabbit_queue_location:select_replicas/6): a new one gets N members, N being its
`x-quorum-initial-group-size` argument, else the `rabbit` application's `quorum_cluster_size`
(default 3, set in advanced.config only). A cluster of N nodes or fewer gives it a member on
every node (stopped ones included); a larger one, the declaring node and the N-1 others
holding the fewest quorum queues. On this three-node cluster: a member on every node.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import string
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from memory_core.devservices.poll import WaitTimeout, wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.rabbitmq import (
    NODE_START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    PrivateRabbitMQ,
    _rabbitmqctl,
    rabbitmq_reachable,
)
from memory_core.devservices.system import DevServicesError, log_tail

HOST = "127.0.0.1"
STATE_FILE = "cluster.json"
COOKIE_FILE = ".erlang.cookie"


class ClusterNode(PrivateRabbitMQ):
    """A `PrivateRabbitMQ` with a given name and port (those of a node recorded in
    in the cluster folder, to find it again) and epmd, if it starts one, on 127.0.0.1 only."""

    def __init__(self, directory: Path, node: str, port: int) -> None:
        super().__init__(directory)
        self.node, self.port = node, port
        self.url = f"amqp://guest:guest@{HOST}:{port}//"
        self._write_config()  # the listener on `port`, not the one __init__ picked

    def _env(self) -> dict[str, str]:
        return {**super()._env(), "ERL_EPMD_ADDRESS": HOST}

    def ctl(self, *args: str) -> str:
        """rabbitmqctl against this node; DevServicesError if it fails."""
        return _rabbitmqctl(args, self.rabbitmqctl)

    def quorum_members(self, vhost: str = "/") -> dict[str, list[str]]:
        """Queue name -> its members (sorted), as this node lists the queues of `vhost`."""
        rows = self.ctl("list_queues", "-p", vhost, "name", "members", "--formatter", "json")
        return {row["name"]: sorted(row["members"]) for row in json.loads(rows)}

    def quorum_leader(self, queue: str, vhost: str = "/") -> str | None:
        """The node leading quorum queue `queue`, as this node reports it (None: no such queue)."""
        rows = json.loads(
            self.ctl("list_queues", "-p", vhost, "name", "leader", "--formatter", "json")
        )
        return next((row["leader"] for row in rows if row["name"] == queue), None)

    def running_nodes(self) -> list[str]:
        """The running members of this node's cluster, as it sees them."""
        status = json.loads(self.ctl("cluster_status", "--formatter", "json"))
        return sorted(status.get("running_nodes", []))


@dataclass
class RabbitClusterServer:
    """A private RabbitMQ cluster: its nodes (node 1 first), their URLs, how to stop it."""

    nodes: list[ClusterNode]
    root: Path
    note: str = ""
    stop: Callable[[], None] | None = field(default=None, repr=False)
    start_s: float | None = None  # how long starting and forming it took (None: reused)

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def failover_url(self) -> str:
        """Celery's broker failover list: every node, node 1 first."""
        return ";".join(self.urls)

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def names(self) -> list[str]:
        return [node.node for node in self.nodes]

    def pids(self) -> list[list[int]]:
        """The live processes of each node's Erlang VM (kill -9 them to crash a node)."""
        return [node.pids() for node in self.nodes]


def _load(root: Path) -> list[ClusterNode]:
    """The nodes recorded under `root` ([] if none are)."""
    try:
        recorded = json.loads((root / STATE_FILE).read_text())
        return [ClusterNode(root / f"node{i}", n["node"], int(n["port"])) for i, n in recorded]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _save(root: Path, nodes: list[ClusterNode]) -> None:
    state = [[i, {"node": n.node, "port": n.port}] for i, n in enumerate(nodes, 1)]
    (root / STATE_FILE).write_text(json.dumps(state))


def cluster_healthy(nodes: list[ClusterNode]) -> bool:
    """Every node answers AMQP and node 1 sees all of them running in its cluster."""
    try:
        return all(rabbitmq_reachable(n.url, timeout_s=1.0) for n in nodes) and nodes[
            0
        ].running_nodes() == sorted(n.node for n in nodes)
    except (DevServicesError, ValueError, IndexError):
        return False


def _new_nodes(root: Path, count: int) -> list[ClusterNode]:
    """Fresh directories sharing one Erlang cookie, a node name and free port each."""
    cookie = "".join(secrets.choice(string.ascii_uppercase) for _ in range(20))
    nodes = []
    for i in range(1, count + 1):
        directory = root / f"node{i}"
        directory.mkdir(parents=True)
        cookie_file = directory / COOKIE_FILE
        cookie_file.write_text(cookie)
        cookie_file.chmod(0o400)  # Erlang refuses a cookie others may read
        nodes.append(ClusterNode(directory, f"amc{os.getpid()}n{i}@localhost", free_port()))
    return nodes


def _join(node: ClusterNode, first: ClusterNode) -> None:
    node.ctl("stop_app")
    node.ctl("join_cluster", first.node)
    node.ctl("start_app")
    wait_for(
        lambda: rabbitmq_reachable(node.url, timeout_s=1.0),
        NODE_START_TIMEOUT_S,
        f"{node.node} to answer AMQP after joining {first.node}",
        lambda: log_tail(node.log),
    )


def _form(nodes: list[ClusterNode]) -> None:
    """Start every node (in parallel), then join nodes 2.. to node 1, one at a time."""
    with ThreadPoolExecutor(len(nodes)) as pool:
        for done in [pool.submit(node.start) for node in nodes]:
            done.result()
    for node in nodes[1:]:
        _join(node, nodes[0])
    wait_for(
        lambda: cluster_healthy(nodes),
        NODE_START_TIMEOUT_S,
        f"{len(nodes)} running nodes in the cluster of {nodes[0].node}",
        lambda: log_tail(nodes[0].log),
    )


def start_rabbitmq_cluster(data_dir: Path, nodes: int = 3) -> RabbitClusterServer:
    """A private cluster of `nodes` nodes under `data_dir/rabbitmq-cluster`, or the healthy one
    already running there (then `stop` is None: not ours to stop)."""
    root = data_dir / "rabbitmq-cluster"
    known = _load(root)
    if len(known) == nodes and cluster_healthy(known):
        note = f"private RabbitMQ cluster already running on {HOST} ports {_ports(known)}"
        return RabbitClusterServer(known, root, note)
    stop_rabbitmq_cluster(data_dir)  # a dead or half-formed one from before
    shutil.rmtree(root, ignore_errors=True)  # its nodes would remember their old cluster
    root.mkdir(parents=True)
    started = time.monotonic()
    cluster = RabbitClusterServer(_new_nodes(root, nodes), root)
    cluster.stop = lambda: _stop(cluster.nodes, root)
    _save(root, cluster.nodes)
    try:
        _form(cluster.nodes)
    except (DevServicesError, WaitTimeout, OSError) as exc:
        cluster.stop()
        raise DevServicesError(f"private RabbitMQ cluster did not form: {exc}") from None
    except BaseException:  # a bug or a signal: nothing half-formed is left running
        cluster.stop()
        raise
    cluster.start_s = time.monotonic() - started
    cluster.note = (
        f"started private RabbitMQ cluster of {nodes} nodes on {HOST} ports "
        f"{_ports(cluster.nodes)} in {cluster.start_s:.1f}s (dir {root})"
    )
    return cluster


def private_cluster_of(failover_url: str, search: Path) -> RabbitClusterServer | None:
    """The healthy private cluster recorded under `search` (in any `*/rabbitmq-cluster`
    folder of it) whose nodes are every host of `failover_url`; None if there is none."""
    parts = [urlsplit(url) for url in failover_url.split(";")]
    if not all(p.hostname in (HOST, "localhost") and p.port for p in parts):
        return None
    wanted = {p.port for p in parts}
    for state in sorted(search.glob(f"*/rabbitmq-cluster/{STATE_FILE}")):
        nodes = _load(state.parent)
        if nodes and wanted <= {n.port for n in nodes} and cluster_healthy(nodes):
            return RabbitClusterServer(nodes, state.parent, f"private cluster in {state.parent}")
    return None


def _ports(nodes: list[ClusterNode]) -> str:
    return ", ".join(str(node.port) for node in nodes)


def _stop(nodes: list[ClusterNode], root: Path) -> None:
    """SIGTERM to every node at once (a clean shutdown), then SIGKILL to what is left."""
    for pid in (pid for node in nodes for pid in node.pids()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(WaitTimeout):
        wait_for(
            lambda: not any(node.pids() for node in nodes),
            STOP_TIMEOUT_S,
            "the cluster's nodes to exit",
            interval_s=0.1,
        )
    for node in nodes:
        node.kill()  # reaps the child it started, if this process started it
    (root / STATE_FILE).unlink(missing_ok=True)


def stop_rabbitmq_cluster(data_dir: Path) -> None:
    """Stop every node of the cluster under `data_dir/rabbitmq-cluster`; none is left running."""
    root = data_dir / "rabbitmq-cluster"
    _stop(_load(root), root)
