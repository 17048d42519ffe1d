"""The publishers' kept broker connections (memory_core/io/broker_connections.py): reused, replaced
when the broker dropped them, declared on every publish, never shared with a forked child, and
bounded. On both brokers (the `broker` fixture), against the real servers."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection

from memory_core.devservices.poll import wait_for
from memory_core.fold.publisher import FOLD_QUEUE, publish_fold
from memory_core.io.broker_connections import (
    IDLE,
    IDLE_PER_BROKER,
    MAX_BROKERS,
    IdleConnections,
    drop,
)
from memory_core.io.queues import is_amqp
from memory_core.metrics import FOLD_PUBLISH_FAILURES
from tests.support.brokers import BROKERS, RABBITMQCTL, ready
from tests.support.services import PrivateRedis

pytestmark = pytest.mark.parametrize("broker", BROKERS, indirect=True)

RETRIED = "memory.publish_retried_on_new_connection"


@pytest.fixture(autouse=True)
def no_kept_connections() -> Iterator[None]:
    IDLE.clear()
    yield
    IDLE.clear()


def _peek(url: str) -> Any:
    """The connection the next publish to `url` would take (left kept)."""
    conn = IDLE.take(url)
    if conn is not None:
        IDLE.keep(url, conn)
    return conn


def _listed() -> dict[str, str]:
    """The node's connections: name -> the connection's process id (what closes it)."""
    out = subprocess.run(
        [RABBITMQCTL, "-q", "list_connections", "name", "pid", "--no-table-headers"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return dict(line.rsplit("\t", 1) for line in out.splitlines() if "\t" in line)


def _drop_binding_or_queue(url: str) -> None:
    """What a broker restart without its data does to the fold queue's declaration."""
    if is_amqp(url):
        with Connection(url) as conn:
            conn.default_channel.queue_delete(FOLD_QUEUE)
        return
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()  # the test's own database (the `broker` fixture flushes it too)
    finally:
        client.close()


def test_publishes_reuse_one_kept_connection(broker: str) -> None:
    assert publish_fold(uuid.uuid4(), broker)
    assert IDLE.count(broker) == 1
    kept = _peek(broker)
    for _ in range(10):
        assert publish_fold(uuid.uuid4(), broker)
    assert IDLE.count(broker) == 1
    assert _peek(broker) is kept  # the same connection served every publish
    assert ready(broker, FOLD_QUEUE) == 11


def test_a_connection_the_broker_closed_is_replaced_and_the_publish_lands(
    broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kept connection goes stale when the broker restarts or closes it: the next publish
    tries once more on a new connection, lands, and is not counted as a failure."""
    private = None if is_amqp(broker) else PrivateRedis(tmp_path)
    url = broker if private is None else private.url
    try:
        assert publish_fold(uuid.uuid4(), url)
        stale = _peek(url)
        if private is None:  # RabbitMQ closes the kept connection (only it: the session's
            # other connections, such as kombu's global pools, must not go stale)
            port = stale.connection.sock.getsockname()[1]
            name = f"127.0.0.1:{port} -> 127.0.0.1:5672"
            subprocess.run(
                [RABBITMQCTL, "-q", "close_connection", _listed()[name], "test"],
                check=True,
                capture_output=True,
                timeout=60,
            )
            wait_for(lambda: name not in _listed(), 30, "RabbitMQ to close the connection")
        else:  # Redis restarts (its AOF keeps the first message)
            private.stop()
            private.start()
        failures = FOLD_PUBLISH_FAILURES._value.get()
        with caplog.at_level(logging.DEBUG, logger="memory_core"):
            assert publish_fold(uuid.uuid4(), url)
        assert FOLD_PUBLISH_FAILURES._value.get() == failures
        assert ready(url, FOLD_QUEUE) == 2
        if private is None:  # (redis-py reconnects a restarted Redis by itself: no retry)
            assert any(RETRIED in r.getMessage() for r in caplog.records)
            assert _peek(url) not in (None, stale)  # the new one is kept, not the stale
    finally:
        IDLE.clear()
        if private is not None:
            private.close()


def test_a_failed_publish_keeps_no_connection(broker: str) -> None:
    dead = "amqp://guest:guest@127.0.0.1:1//" if is_amqp(broker) else "redis://127.0.0.1:1/0"
    assert not publish_fold(uuid.uuid4(), dead)
    assert IDLE.count(dead) == 0
    assert publish_fold(uuid.uuid4(), broker)
    assert IDLE.count(broker) == 1


def test_a_queue_gone_since_the_last_publish_is_declared_again(broker: str) -> None:
    """Every publish declares its queue, kept connection or not: without that, RabbitMQ
    confirms a message no queue takes, and kombu's Redis transport drops it."""
    assert publish_fold(uuid.uuid4(), broker)
    _drop_binding_or_queue(broker)
    assert IDLE.count(broker) == 1
    assert publish_fold(uuid.uuid4(), broker)
    assert ready(broker, FOLD_QUEUE) == 1


def test_a_forked_child_never_touches_its_parents_connection(broker: str) -> None:
    assert publish_fold(uuid.uuid4(), broker)
    kept = _peek(broker)
    pid = os.fork()
    if pid == 0:  # the child: no connection of its parent's; it publishes on its own
        code = 3
        try:
            if IDLE.take(broker) is None and publish_fold(uuid.uuid4(), broker):
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's connection still works, as it was: no retry, the same connection kept.
    assert publish_fold(uuid.uuid4(), broker)
    assert _peek(broker) is kept
    assert ready(broker, FOLD_QUEUE) == 3


def test_threads_publishing_at_once_each_land_and_few_connections_stay(broker: str) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: publish_fold(uuid.uuid4(), broker), range(120)))
    assert all(results)
    assert ready(broker, FOLD_QUEUE) == 120
    assert 1 <= IDLE.count(broker) <= IDLE_PER_BROKER


def test_idle_connections_are_bounded_per_broker_and_in_brokers(broker: str) -> None:
    idle = IdleConnections()
    urls = [f"{broker}?n={n}" for n in range(MAX_BROKERS + 1)]
    conns = [Connection(broker) for _ in range(IDLE_PER_BROKER + 1)]
    for conn in conns:
        idle.keep(urls[0], conn)
    assert idle.count(urls[0]) == IDLE_PER_BROKER
    for url in urls[1:]:
        idle.keep(url, Connection(broker))
    assert idle.count(urls[0]) == 0  # the least recently used broker's were closed
    assert [idle.count(u) for u in urls[1:]] == [1] * MAX_BROKERS
    idle.clear()
    assert [idle.count(u) for u in urls] == [0] * len(urls)


def test_dropping_a_connection_leaves_the_process_socket_timeout_alone(
    broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu's `collect` sets the process-wide default socket timeout for a moment on Redis,
    which sockets other threads of the host create meanwhile would take."""
    assert publish_fold(uuid.uuid4(), broker)
    conn = IDLE.take(broker)
    assert conn is not None
    calls: list[float | None] = []
    monkeypatch.setattr(socket, "setdefaulttimeout", calls.append)
    drop(conn)
    assert calls == []
    assert not conn.connected  # closed all the same
