"""Jobs sent raw, as any producer could: a Celery protocol-2 message built by hand, with
whatever task name, arguments, content type and body the test wants (kombu, no Celery app)."""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

from kombu import Connection, Exchange, Producer

from memory_core.devservices.workers import QUEUES
from memory_core.io.queues import EXCHANGE, is_amqp
from memory_core.settings import get_settings


def send_raw(
    url: str,
    queue: str,
    task: str,
    args: Any = (),
    kwargs: Any = None,
    *,
    content_type: str = "application/json",
    body: bytes | None = None,
) -> str:
    """Publish one job to `queue` as the README's snippet routes it; its task id. The
    headers carry Celery's default `argsrepr`: the whole arguments, as a careless producer."""
    task_id = str(uuid.uuid4())
    headers = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "retries": 0,
        "argsrepr": repr(args),
        "kwargsrepr": repr(kwargs or {}),
        "origin": "test",
        "ignore_result": True,
    }
    if body is None:
        body = json.dumps([args, kwargs or {}, {}]).encode()
    amqp = is_amqp(url)
    exchange = Exchange(EXCHANGE, type="topic") if amqp else Exchange("")
    with Connection(url, transport_options={"confirm_publish": True} if amqp else {}) as conn:
        Producer(conn).publish(
            body,
            exchange=exchange,
            routing_key=queue,
            content_type=content_type,
            content_encoding="utf-8"
            if content_type.startswith(("application/json", "text"))
            else "binary",
            headers=headers,
            correlation_id=task_id,
            declare=[],
            retry=False,
        )
    return task_id


def dead_letters(url: str) -> list[bytes]:
    """The bodies waiting in `memory.dead` (RabbitMQ), taken off the queue."""
    if not is_amqp(url):
        return []
    got: list[bytes] = []
    with Connection(url) as conn:
        channel = conn.channel()
        try:
            while (msg := channel.basic_get("memory.dead", no_ack=True)) is not None:
                got.append(bytes(msg.body))
        except conn.channel_errors:  # not declared yet: nothing was dead-lettered
            pass
    return got


def settings_stream() -> str:
    return get_settings().memory_events_stream


def checkout_worker_argv(concurrency: int = 2) -> list[str]:
    """A worker of the checkout the tests run from (`celery -A workers.app`, cwd = the
    checkout): an editable install maps `memory_core.workers` to one checkout only."""
    return [
        *(sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-Q", QUEUES),
        *("-c", str(concurrency), "--pool", "prefork", "-l", "INFO", "--without-gossip"),
        *("--without-mingle", "--prefetch-multiplier", "1", "-n", f"k{uuid.uuid4().hex[:6]}@%h"),
    ]
