"""The two brokers as tests see them: what is queued, held and dead-lettered, on either.

Redis (kombu's transport): one list per queue, a hash `unacked` of what workers hold.
RabbitMQ: passive declares for what is ready; `rabbitmqctl list_queues` for what consumers
hold (unacked), which AMQP itself does not tell a client.
"""

from __future__ import annotations

import shutil
import subprocess
from urllib.parse import unquote, urlsplit

import redis
from celery import Celery
from kombu import Connection

from memory_core.devservices.rabbitmq import purge_queues
from memory_core.io.queues import FINALIZE_QUEUE, FOLD_QUEUE, is_amqp

BROKERS = ["redis", "rabbitmq"]  # indirect parametrization of the `broker` fixture
RABBITMQCTL = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
# Native delayed delivery's queues: celery_delayed_0 (1 s) ... celery_delayed_27 (2^27 s).
DELAY_QUEUES = [f"celery_delayed_{level}" for level in range(28)]


def vhost_of(url: str) -> str:
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def ready(url: str, queue: str) -> int:
    """Messages waiting on `queue` (not held by a consumer); 0 for a queue that does not exist."""
    if not is_amqp(url):
        client = redis.Redis.from_url(url)
        try:
            return int(client.llen(queue))
        finally:
            client.close()
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        try:
            return int(channel.queue_declare(queue, passive=True).message_count)
        except conn.channel_errors as exc:
            if getattr(exc, "reply_code", None) == 404:  # NOT_FOUND
                return 0
            raise


def rabbitmq_queues(url: str) -> dict[str, tuple[int, int]]:
    """Every queue of the URL's vhost: name -> (ready, unacked), from the local node."""
    columns = ["name", "messages_ready", "messages_unacknowledged"]
    out = subprocess.run(
        [RABBITMQCTL, "-q", "list_queues", "-p", vhost_of(url), *columns, "--no-table-headers"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    queues: dict[str, tuple[int, int]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit():
            queues[parts[0]] = (int(parts[1]), int(parts[2]))
    return queues


def held(url: str) -> int:
    """Jobs taken by a worker and not yet acked (running, prefetched or waiting for an ETA)."""
    if not is_amqp(url):
        client = redis.Redis.from_url(url)
        try:
            return int(client.hlen("unacked"))
        finally:
            client.close()
    queues = rabbitmq_queues(url)
    return sum(queues.get(name, (0, 0))[1] for name in (FINALIZE_QUEUE, FOLD_QUEUE))


def delayed(url: str) -> int:
    """RabbitMQ: messages waiting in native delayed delivery's queues (retry countdowns)."""
    queues = rabbitmq_queues(url)
    return sum(queues.get(name, (0, 0))[0] for name in DELAY_QUEUES)


def purge(url: str, queues: list[str]) -> None:
    """Empty the queues that exist (Redis: the whole test database)."""
    if not is_amqp(url):
        client = redis.Redis.from_url(url)
        client.flushdb()
        client.close()
        return
    purge_queues(url, queues)


def scheduled(url: str) -> int:
    """Tasks every worker on the broker holds for a later ETA (`celery inspect scheduled`);
    raises when no worker answers, so 0 means "answered, holding none"."""
    app = Celery("test-inspect", broker=url, set_as_current=False)
    try:
        replies = app.control.inspect(timeout=3).scheduled()
    finally:
        app.close()
    if not replies:
        raise AssertionError("no worker answered `inspect scheduled`")
    return sum(len(tasks) for tasks in replies.values())
