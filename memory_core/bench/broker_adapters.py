"""The brokers `agent-memory bench workers` runs on: how it publishes to each, what each holds.

Redis (`redis://`): a database of the bench's own; the keys the bench created are deleted at
the end. RabbitMQ (`amqp://`): on the machine's node (a local URL, port 5672) the bench runs in
a throwaway vhost it creates and deletes; elsewhere in the URL's vhost, whose task queues it
purges at the end. Queues are declared exactly as the workers declare them
(`memory_core.io.queues.task_queues`: quorum queues on the topic exchange `memory`). What the
broker holds (backlog) on Redis: the queue lists and kombu's `unacked` hash. On RabbitMQ: the
ready messages (passive declares) and, once none is ready, what the worker holds (`inspect`
active + reserved), since AMQP does not tell a client what other consumers hold unacked.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import celery
import redis
from kombu import Connection
from kombu.transport.memory import Channel as MemoryChannel

from memory_core.devservices.rabbitmq import (
    DEFAULT_URL as RABBITMQ_DEFAULT_URL,
)
from memory_core.devservices.rabbitmq import (
    LOCAL_HOSTS,
    drop_vhost,
    purge_queues,
    test_vhost,
)
from memory_core.io.queues import (
    DEAD_LETTER_QUEUE,
    EXCHANGE,
    FINALIZE_QUEUE,
    FOLD_QUEUE,
    dead_letter_queue,
    is_amqp,
    task_queues,
)

# `--brokers redis`: this database of REDIS_URL's server. Test sessions take 3-15 as their
# broker and FLUSHDB it at start; 0 holds the working copies.
BENCH_REDIS_DB = 2
BROKER_NAMES = ("redis", "rabbitmq")
CONFIRM_TIMEOUT_S = 30.0
RABBITMQ_PORT = 5672  # the machine's node, the one `rabbitmqctl` manages
RABBITMQCTL_TIMEOUT_S = 30.0


def without_credentials(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//", url)


def render_envelopes(task: str, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages `send_task` would write, as kombu envelopes (its memory transport)."""
    app = celery.Celery("agent-memory-bench", set_as_current=False)
    with app.connection_for_write("memory://") as conn:  # explicit: CELERY_BROKER_URL wins
        producer = app.amqp.Producer(conn)
        for payload in payloads:
            app.send_task(task, args=[payload], queue=FINALIZE_QUEUE, producer=producer)
        box = MemoryChannel.queues[FINALIZE_QUEUE]
        return [box.get_nowait() for _ in payloads]


class RedisBroker:
    """kombu's Redis layout: a list per queue (and its priority lists), the `unacked` hash.
    Its backlog is exact. The keys that were not there at the start are deleted at the end."""

    kind = "redis"

    def __init__(self, url: str, redis_url: str) -> None:
        mine, theirs = urlsplit(url), urlsplit(redis_url)
        same_server = (mine.hostname, mine.port or 6379) == (theirs.hostname, theirs.port or 6379)
        if same_server and (mine.path.strip("/") or "0") == (theirs.path.strip("/") or "0"):
            raise ValueError(
                "the bench worker needs a broker database of its own, not REDIS_URL's "
                f"(e.g. {urlunsplit(mine._replace(path=f'/{BENCH_REDIS_DB}'))})"
            )
        self.url = self.where = url
        self.client = redis.Redis.from_url(url)
        try:
            self._before = set(self.client.scan_iter(count=1000))
        except redis.ConnectionError as exc:  # named as the broker, not as REDIS_URL
            self.client.close()
            where = without_credentials(url)
            raise RuntimeError(f"cannot reach the broker at {where}: {exc}") from None

    def version(self) -> str:
        return f"Redis {self.client.info('server').get('redis_version', '?')}"

    def render(self, envelopes: list[dict[str, Any]]) -> list[bytes]:
        return [json.dumps(e).encode() for e in envelopes]

    def publish(self, messages: list[Any]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for i in range(0, len(messages), 100):
            pipe.lpush(FINALIZE_QUEUE, *messages[i : i + 100])  # BRPOP: first in, first out
        pipe.execute()

    def exact_backlog(self) -> int:
        """Messages queued or delivered-but-unacked (kombu's Redis layout)."""
        pipe = self.client.pipeline(transaction=False)
        for q in (FINALIZE_QUEUE, FOLD_QUEUE):
            for key in (q, *(f"{q}\x06\x16{p}" for p in (3, 6, 9))):  # kombu priority lists
                pipe.llen(key)
        pipe.hlen("unacked")
        return int(sum(pipe.execute()))

    def backlog(self, held: Callable[[], int]) -> int:
        return self.exact_backlog()

    def left(self) -> int:
        """After the worker stopped: jobs still on the broker (queued or unacked)."""
        return self.exact_backlog()

    def close(self) -> None:
        created = [k for k in self.client.scan_iter(count=1000) if k not in self._before]
        for i in range(0, len(created), 500):
            self.client.delete(*created[i : i + 500])
        self.client.close()


def _rabbitmqctl() -> str | None:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    return shutil.which("rabbitmqctl", path=search)


class RabbitBroker:
    """RabbitMQ: a throwaway vhost on the machine's node, else the URL's vhost (purged at the
    end). Publishes on one confirm-mode channel and waits once per batch for its confirms."""

    kind = "rabbitmq"

    def __init__(self, url: str, tag: str) -> None:
        parts = urlsplit(url.split(";", maxsplit=1)[0])  # a failover list: its first node decides
        failover = ";" in url
        self.vhost: str | None = None
        self.where = without_credentials(url)
        self.conn: Any = None
        local = parts.hostname in LOCAL_HOSTS and (parts.port or RABBITMQ_PORT) == RABBITMQ_PORT
        local = local and not failover  # the URL's vhost on every node, purged at the end
        if local and _rabbitmqctl() is not None:  # the machine's node: a vhost of our own
            self.vhost = f"agent_memory_benchw_{tag}"
            url = test_vhost(url, self.vhost)
            self.where = without_credentials(url) + " (throwaway vhost)"
        self.url = url
        try:
            self.conn = Connection(url, connect_timeout=5)
            self.conn.ensure_connection(max_retries=1)
            setup = self.conn.channel()
            for queue in (*task_queues(url), dead_letter_queue()):  # as the workers declare them
                queue(setup).declare()
            setup.close()
            self.pub = self.conn.channel()
            self.pub.confirm_select()
            self.pub.events["basic_ack"].add(self._acked)
            self.pub.events["basic_nack"].add(self._nacked)
            self.info = self.conn.channel()
        except BaseException:
            self.close()
            raise
        self.sent, self.unconfirmed, self.nacked = 0, set[int](), 0

    def _acked(self, tag: int, multiple: bool) -> None:
        if multiple:
            self.unconfirmed = {t for t in self.unconfirmed if t > tag}
        else:
            self.unconfirmed.discard(tag)

    def _nacked(self, tag: int, multiple: bool) -> None:
        before = len(self.unconfirmed)
        self._acked(tag, multiple)
        self.nacked += before - len(self.unconfirmed)

    def version(self) -> str:
        version = self.conn.connection.server_properties.get("version", "?")
        return f"RabbitMQ {version.decode() if isinstance(version, bytes) else version}"

    def render(self, envelopes: list[dict[str, Any]]) -> list[Any]:
        """The AMQP messages Celery publishes for these envelopes (body, headers, properties)."""
        out = []
        for e in envelopes:
            props = e["properties"]
            keep = {"correlation_id": props["correlation_id"], "reply_to": props["reply_to"]}
            out.append(
                self.pub.prepare_message(
                    base64.b64decode(e["body"]),
                    props.get("priority", 0),
                    e["content-type"],
                    e["content-encoding"],
                    e["headers"],
                    keep | {"delivery_mode": 2},
                )
            )
        return out

    def publish(self, messages: list[Any]) -> None:
        for message in messages:
            self.sent += 1  # delivery tags of a confirm-mode channel: 1, 2, ...
            self.unconfirmed.add(self.sent)
            self.pub.basic_publish(message, exchange=EXCHANGE, routing_key=FINALIZE_QUEUE)
        deadline = time.monotonic() + CONFIRM_TIMEOUT_S
        while self.unconfirmed:
            self.conn.drain_events(timeout=max(0.1, deadline - time.monotonic()))
        if self.nacked:
            raise RuntimeError(f"RabbitMQ refused (nacked) {self.nacked} published jobs")

    def ready(self, names: Sequence[str] = (FINALIZE_QUEUE, FOLD_QUEUE)) -> int:
        total = 0
        for name in names:
            try:
                total += int(self.info.queue_declare(name, passive=True).message_count)
            except self.conn.channel_errors as exc:
                if getattr(exc, "reply_code", None) != 404:  # NOT_FOUND: none there
                    raise
                self.info = self.conn.channel()  # the error closed it
        return total

    def backlog(self, held: Callable[[], int]) -> int:
        """Ready messages; once none is, what the worker holds (taken, not acked)."""
        return self.ready() or held()

    def left(self) -> int:
        """After the worker stopped: jobs on the broker, ready or unacked, in the task, dead-letter
        and delay queues (`rabbitmqctl list_queues` on the throwaway vhost, else ready ones:
        the worker's connection is closed, so what it held is back in its queue)."""
        ctl = _rabbitmqctl()
        if self.vhost is None or ctl is None:
            return self.ready((FINALIZE_QUEUE, FOLD_QUEUE, DEAD_LETTER_QUEUE))
        args = ["-q", "list_queues", "-p", self.vhost, "name", "messages", "--no-table-headers"]
        proc = subprocess.run(
            [ctl, *args], capture_output=True, text=True, timeout=RABBITMQCTL_TIMEOUT_S, check=True
        )
        counted = (FINALIZE_QUEUE, FOLD_QUEUE, DEAD_LETTER_QUEUE)
        total = 0
        for line in proc.stdout.splitlines():
            name, _, count = line.rpartition(" ")
            name = name.strip()
            if count.isdigit() and (name in counted or name.startswith("celery_delayed_")):
                total += int(count)
        return total

    def close(self) -> None:
        try:
            if self.conn is not None:
                self.conn.release()
        finally:
            if self.vhost is not None:
                drop_vhost(self.vhost)
            else:
                purge_queues(self.url, [FINALIZE_QUEUE, FOLD_QUEUE])


Broker = RedisBroker | RabbitBroker


def open_broker(broker_url: str, redis_url: str, tag: str) -> Broker:
    if is_amqp(broker_url):
        return RabbitBroker(broker_url, tag)
    return RedisBroker(broker_url, redis_url)


def resolve_broker(spec: str, *, redis_url: str, celery_broker_url: str = "") -> str:
    """A broker URL for `spec`: a URL as it is; `redis`, database BENCH_REDIS_DB of REDIS_URL's
    server; `rabbitmq`, CELERY_BROKER_URL if it is AMQP, else the machine's node."""
    if spec == "redis":
        return urlunsplit(urlsplit(redis_url)._replace(path=f"/{BENCH_REDIS_DB}"))
    if spec == "rabbitmq":
        return celery_broker_url if is_amqp(celery_broker_url) else RABBITMQ_DEFAULT_URL
    if "://" not in spec:
        raise ValueError(f"unknown broker {spec!r}: a URL, or one of {', '.join(BROKER_NAMES)}")
    return spec
