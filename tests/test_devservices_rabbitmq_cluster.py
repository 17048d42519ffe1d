"""memory_core.devservices.rabbitmq_cluster: a private RabbitMQ cluster of three local nodes.

One cluster for the module, the tests in file order: its shape (one cluster of three running
nodes, loopback only), reuse of a running one, quorum queue membership, the command's export of
the failover list, the demo's vhost of its own on it, a node killed -9 with the two others
serving through Celery's failover URL, and a stop that leaves no node running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection

from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.private_broker import create_vhost
from memory_core.devservices.rabbitmq import rabbitmq_reachable
from memory_core.devservices.rabbitmq_cluster import (
    STATE_FILE,
    RabbitClusterServer,
    start_rabbitmq_cluster,
    stop_rabbitmq_cluster,
)
from memory_core.devservices.system import DevServicesError, alive

pytestmark = pytest.mark.workers  # private RabbitMQ nodes
QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rabbit-cluster")


@pytest.fixture(scope="module")
def cluster(data_dir: Path) -> Iterator[RabbitClusterServer]:
    server = start_rabbitmq_cluster(data_dir)
    yield server
    if server.stop is not None:
        server.stop()
    stop_rabbitmq_cluster(data_dir)


def _declare(url: str, name: str, **arguments: object) -> None:
    with Connection(url, connect_timeout=5) as conn:
        conn.channel().queue_declare(
            name, durable=True, auto_delete=False, arguments={**QUORUM, **arguments}
        )


def _listening(pids: list[int]) -> set[tuple[str, int]]:
    """(address in hex as /proc/net/tcp* writes it, port) of every socket these pids listen on."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, _, port = fields[1].partition(":")
                found.add((address, int(port, 16)))
    return found


def test_three_nodes_form_one_cluster_on_loopback(cluster: RabbitClusterServer) -> None:
    assert len(cluster.nodes) == 3 and len(set(cluster.ports)) == 3
    for node in cluster.nodes:
        assert node.running_nodes() == sorted(cluster.names)
        assert rabbitmq_reachable(node.url)
    assert cluster.failover_url == ";".join(
        f"amqp://guest:guest@127.0.0.1:{p}//" for p in cluster.ports
    )
    for node, pids in zip(cluster.nodes, cluster.pids(), strict=True):
        listening = _listening(pids)
        assert ("0100007F", node.port) in listening  # AMQP, and Erlang distribution
        assert {address for address, _ in listening} == {"0100007F"}  # 127.0.0.1 only


def test_a_running_cluster_is_reused_not_restarted(
    data_dir: Path, cluster: RabbitClusterServer
) -> None:
    again = start_rabbitmq_cluster(data_dir)
    assert again.stop is None and "already running" in again.note
    assert again.ports == cluster.ports and again.names == cluster.names
    assert again.pids() == cluster.pids()


def test_a_quorum_queue_gets_a_member_on_every_node(cluster: RabbitClusterServer) -> None:
    _declare(cluster.urls[1], "am.cluster.everywhere")
    _declare(cluster.urls[1], "am.cluster.two", **{"x-quorum-initial-group-size": 2})
    members = cluster.nodes[0].quorum_members()
    assert members["am.cluster.everywhere"] == sorted(cluster.names)
    assert len(members["am.cluster.two"]) == 2 and cluster.names[1] in members["am.cluster.two"]


def test_the_command_exports_the_failover_list(
    data_dir: Path, cluster: RabbitClusterServer
) -> None:
    """`python -m memory_core.devservices --rabbitmq-cluster`: the broker URL is the running
    cluster's failover list (reused, not started anew)."""
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "memory_core.devservices",
            "--data-dir",
            str(data_dir),
            "--rabbitmq-cluster",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    exports = dict(
        line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines()
    )
    assert exports["CELERY_BROKER_URL"].strip("'") == cluster.failover_url
    assert "already running" in started.stderr
    assert cluster.pids() == start_rabbitmq_cluster(data_dir).pids()


def test_the_demo_gets_a_vhost_of_its_own_on_the_cluster(
    data_dir: Path, cluster: RabbitClusterServer
) -> None:
    broker = create_vhost(cluster.failover_url, "t1", search=data_dir.parent)
    name = "agent_memory_demo_t1"
    urls = broker.url.split(";")
    assert len(urls) == 3 and all(url.endswith(f"/{name}") for url in urls)
    for url in urls:  # a vhost is the cluster's: every node serves it
        with Connection(url, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
    _declare(urls[2], "am.cluster.demo")
    rows = cluster.nodes[0].ctl("list_queues", "-p", name, "name", "--formatter", "json")
    assert [row["name"] for row in json.loads(rows)] == ["am.cluster.demo"]
    with pytest.raises(DevServicesError, match="exists already"):
        create_vhost(cluster.failover_url, "t1", search=data_dir.parent)
    assert broker.release() == f"deleted vhost {name}"
    assert name not in cluster.nodes[1].ctl("list_vhosts", "--no-table-headers", "name").split()


def test_a_failover_list_of_no_private_cluster_is_refused(data_dir: Path) -> None:
    stray = ";".join(f"amqp://guest:guest@127.0.0.1:{free_port()}//" for _ in range(3))
    with pytest.raises(DevServicesError, match="--rabbitmq-cluster"):
        create_vhost(stray, "t2", search=data_dir.parent)
    remote = "amqp://u:p@rabbit-1.example//;amqp://u:p@rabbit-2.example//"
    with pytest.raises(DevServicesError, match="failover list"):
        create_vhost(remote, "t2", search=data_dir.parent)


def test_a_node_killed_minus_9_leaves_the_two_others_serving(
    cluster: RabbitClusterServer,
) -> None:
    queue = "am.cluster.survives"
    _declare(cluster.urls[0], queue)  # its leader on node 1, the one killed
    victim = cluster.nodes[0]
    for pid in victim.pids():
        # A short-lived helper of the node (erl_child_setup's children) may be gone already.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not victim.pids(), 10, "the killed node's processes to go")
    assert not rabbitmq_reachable(victim.url)
    survivors = cluster.nodes[1:]
    wait_for(
        lambda: survivors[0].running_nodes() == sorted(n.node for n in survivors),
        30,
        "the survivors to see the node gone",
    )
    # basic.get asks the queue's leader: a dead one is a 541 (nodedown) until Ra elects another.
    wait_for(
        lambda: cluster.nodes[1].quorum_leader(queue) in {n.node for n in survivors},
        30,
        "a survivor to lead the queue",
    )
    # Celery's failover list: node 1 refuses, the connection moves on to node 2.
    with Connection(cluster.failover_url, connect_timeout=5) as conn:
        conn.ensure_connection(max_retries=3, interval_start=0, interval_step=0.2)
        assert conn.port in {node.port for node in survivors}
        channel = conn.channel()
        channel.confirm_select()  # the publish returns once a majority (2 of 3) has it
        message = channel.prepare_message(b"after the crash")
        channel.basic_publish(message, exchange="", routing_key=queue)
        got = wait_for(lambda: channel.basic_get(queue, no_ack=True), 20, "the message back")
    assert got.body == b"after the crash"


def test_stop_ends_every_node(data_dir: Path, cluster: RabbitClusterServer) -> None:
    pids = [pid for node_pids in cluster.pids() for pid in node_pids]
    assert pids  # the two survivors
    stop_rabbitmq_cluster(data_dir)
    assert not any(alive(pid) for pid in pids) and cluster.pids() == [[], [], []]
    assert not any(rabbitmq_reachable(url) for url in cluster.urls)
    assert not (data_dir / "rabbitmq-cluster" / STATE_FILE).exists()
    stop_rabbitmq_cluster(data_dir)  # twice: nothing to do, no error
