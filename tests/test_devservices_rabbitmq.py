"""memory_core.devservices.rabbitmq against real RabbitMQ: the machine's node (found, started or
installed), a vhost of the test's own on it, and a private node killed with SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from kombu import Connection, Exchange, Queue

from memory_core.devservices.ports import free_port
from memory_core.devservices.rabbitmq import (
    LOCAL_HOSTS,
    PrivateRabbitMQ,
    drop_vhost,
    ensure_rabbitmq,
    purge_queues,
    rabbitmq_reachable,
    test_vhost,
    with_vhost,
)
from memory_core.devservices.system import DevServicesError

# Not the session's vhost (tests/fixtures/broker.py): dropping this one disturbs nobody.
VHOST = f"agent_memory_test_{os.getpid()}_devservices"
# RabbitMQ 3.10's Ra saves its registry of quorum queue members (names.dets) every 500 ms: a
# node killed sooner after a queue's declaration recreates that queue empty on restart.
RA_DIRECTORY_SAVE_S = 0.5


@pytest.fixture(scope="module")
def base_url() -> str:
    return ensure_rabbitmq(os.environ.get("MEMORY_TEST_RABBITMQ_URL"))


def _not_found(url: str, queue: str) -> bool:
    """Does a passive declare of `queue` at `url` answer NOT_FOUND?"""
    with Connection(url, connect_timeout=5) as conn:
        try:
            conn.channel().queue_declare(queue, passive=True)
        except conn.channel_errors as exc:
            return getattr(exc, "reply_code", None) == 404
    return False


def _beams_of(directory: Path) -> list[int]:
    """Erlang VMs whose home is `directory` (their command line says `-home <dir>`)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(directory).encode() in argv and (entry / "stat").read_text().split()[2] != "Z":
            found.append(int(entry.name))
    return found


def test_ensure_rabbitmq_returns_a_url_that_answers(base_url: str) -> None:
    assert rabbitmq_reachable(base_url)
    with Connection(base_url, connect_timeout=5) as conn:
        assert conn.default_channel.is_open
    started = time.monotonic()
    assert ensure_rabbitmq(base_url) == base_url  # answers: nothing started, nothing waited
    assert time.monotonic() - started < 2


def test_a_broker_that_refuses_or_is_out_of_reach_is_a_clear_error(base_url: str) -> None:
    wrong_password = base_url.replace("@", "x@", 1) if "@" in base_url else None
    if wrong_password:
        with pytest.raises(DevServicesError, match=r"answers at .* but: .*ACCESS_REFUSED"):
            ensure_rabbitmq(wrong_password)
    with pytest.raises(DevServicesError, match=r"does not answer at 192\.0\.2\.1:5672"):
        ensure_rabbitmq("amqp://guest:guest@192.0.2.1:5672//")  # TEST-NET: never local
    local_node = urlsplit(base_url).hostname in LOCAL_HOSTS and shutil.which(
        "rabbitmq-diagnostics", path=f"{os.environ.get('PATH', '')}:/usr/sbin"
    )
    if local_node and os.geteuid() == 0:  # the machine's node answered: it is not restarted
        with pytest.raises(DevServicesError, match="node runs but nothing answers at"):
            ensure_rabbitmq(f"amqp://guest:guest@127.0.0.1:{free_port()}//")


def test_a_test_vhost_is_private_purged_and_dropped(base_url: str) -> None:
    url = test_vhost(base_url, VHOST)
    try:
        assert test_vhost(base_url, VHOST) == url  # idempotent
        assert url.endswith(f"/{VHOST}")
        queue = Queue("am.devservices.probe", Exchange("am.devservices", type="direct"))
        with Connection(url, connect_timeout=5) as conn:
            conn.Producer().publish({"n": 1}, exchange=queue.exchange, declare=[queue])
            conn.Producer().publish({"n": 2}, exchange=queue.exchange, declare=[queue])
        assert _not_found(with_vhost(base_url, "/"), queue.name)  # not in the default vhost
        assert purge_queues(url, [queue.name, "am.devservices.missing"]) == {queue.name: 2}
        assert purge_queues(url, [queue.name]) == {queue.name: 0}
    finally:
        drop_vhost(VHOST)
    drop_vhost(VHOST)  # a vhost that is gone is no error
    with pytest.raises(DevServicesError, match="NOT_ALLOWED"):
        rabbitmq_reachable(url)


@pytest.mark.workers  # a private RabbitMQ node
def test_a_private_node_keeps_quorum_queue_messages_across_kill_9(base_url: str) -> None:
    node = PrivateRabbitMQ()
    queue = Queue(
        "am.durable",
        Exchange("am.durable", type="direct"),
        routing_key="am.durable",
        durable=True,
        queue_arguments={"x-queue-type": "quorum"},
    )
    with node:
        assert node.last_start_s is not None and node.port != 5672
        with Connection(node.url, transport_options={"confirm_publish": True}) as conn:
            queue(conn.default_channel).declare()
            time.sleep(2 * RA_DIRECTORY_SAVE_S)
            conn.Producer().publish(
                {"job": 1}, exchange=queue.exchange, routing_key=queue.routing_key,
                delivery_mode=2,
            )  # fmt: skip  # confirmed: on the node's disk
        pids = node.pids()
        assert len(pids) >= 2  # beam.smp and erl_child_setup at least

        node.kill()
        assert node.pids() == [] and _beams_of(node.dir) == []
        assert not rabbitmq_reachable(node.url)
        assert rabbitmq_reachable(base_url)  # the machine's node was not touched

        node.restart()
        # read_timeout: a queue without a leader would block basic.get for minutes.
        with Connection(node.url, transport_options={"read_timeout": 20}) as conn:
            message = conn.default_channel.basic_get(queue.name, no_ack=True)
        assert message is not None and json.loads(message.body) == {"job": 1}

        private_vhost = test_vhost(node.url, "am_private", rabbitmqctl=node.rabbitmqctl)
        assert rabbitmq_reachable(private_vhost)

        node.stop()
        assert node.pids() == [] and _beams_of(node.dir) == []
        assert not rabbitmq_reachable(node.url)
    assert not node.dir.exists()  # its own throwaway directory is removed
