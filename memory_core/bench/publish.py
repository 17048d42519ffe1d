"""`agent-memory bench publish`: one publish (`enqueue_turn`'s and every fold request's
`send_by_name`) against its raw limit, per broker.

- **publish on a kept connection**: `send_by_name` of a fold job, as the product sends it;
- **a new connection per publish**: what every publish did before connections were kept
  (connect, declare, publish, close), for reference;
- **raw limit**: kombu's `Producer.publish` of the same body on one connection opened before the
  timer, with the same declaration each time (`declare=[queue]`, its cache cleared) and the same
  transport options (publisher confirms on RabbitMQ): the same I/O, without Celery's message.

Sides are interleaved (memory_core/bench/common.py `paired`). The bench publishes to
`memory.fold` of the broker it is given, so that broker must be one nothing consumes from: it
refuses one with jobs queued there, and empties the queue when it is done.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from memory_core.bench.common import Pair, format_table, machine, paired
from memory_core.fold.publisher import FOLD_QUEUE, FOLD_TASK, publisher_app, send_by_name
from memory_core.io.broker_connections import IDLE, drop
from memory_core.io.queues import is_amqp, task_queue

GOAL = 1.5  # a publish on a kept connection vs the raw limit


class BrokerInUse(RuntimeError):
    """The broker given has jobs queued: the bench would publish among them, then purge them."""


def _queued(url: str) -> int:
    """Jobs waiting on the fold queue; a passive declare on RabbitMQ (never declares it)."""
    if not is_amqp(url):
        import redis

        client = redis.Redis.from_url(url)
        try:
            return int(client.llen(FOLD_QUEUE))
        finally:
            client.close()
    with publisher_app(url).connection_for_write(url) as conn:
        try:
            return int(conn.channel().queue_declare(FOLD_QUEUE, passive=True).message_count)
        except conn.channel_errors as exc:
            if getattr(exc, "reply_code", None) == 404:  # NOT_FOUND: no queue, no jobs
                return 0
            raise


def _purge(url: str) -> None:
    from memory_core.devservices.rabbitmq import purge_queues

    if is_amqp(url):
        purge_queues(url, [FOLD_QUEUE])
        return
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.delete(FOLD_QUEUE)
    finally:
        client.close()


def _sides(url: str) -> tuple[Callable[[int], object], Callable[[int], object], Any]:
    app = publisher_app(url)
    declared = task_queue(url, FOLD_QUEUE)
    conn = app.connection_for_write(url)
    producer = conn.Producer(serializer="json")

    def raw(_: int) -> None:
        conn.declared_entities.clear()
        producer.publish(
            {"thread_id": str(uuid.uuid4())},
            exchange=declared.exchange,
            routing_key=declared.routing_key,
            declare=[declared],
            retry=False,
        )

    def new_connection(_: int) -> None:
        with app.connection_for_write(url) as fresh:
            app.send_task(
                FOLD_TASK, args=[str(uuid.uuid4())], queue=declared, connection=fresh, retry=False
            )

    return raw, new_connection, conn


def _kept(url: str) -> Callable[[int], object]:
    return lambda _: send_by_name(FOLD_TASK, [str(uuid.uuid4())], FOLD_QUEUE, url)


def _bench_one(url: str, publishes: int, warmup: int) -> list[Pair]:
    raw, new_connection, conn = _sides(url)
    try:
        kept = paired(publishes, warmup, _kept(url), raw)
        fresh = paired(publishes, warmup, new_connection, raw)
    finally:
        drop(conn)
    kind = "rabbitmq" if is_amqp(url) else "redis"
    raw_label = f"kombu publish + declare on an open connection ({kind})"
    return [
        Pair(f"{kind}_kept", f"{kind}: publish on a kept connection", raw_label, GOAL, *kept),
        Pair(
            f"{kind}_new",
            f"{kind}: a new connection per publish (before)",
            raw_label,
            GOAL,
            *fresh,
        ),
    ]


def bench_publish(
    broker_urls: Sequence[str], publishes: int = 300, out: Callable[[str], object] = print
) -> dict[str, float]:
    """Print the table; every figure (per broker: `redis_kept.ratio`, ...)."""
    for url in broker_urls:
        if _queued(url):
            raise BrokerInUse(
                f"{FOLD_QUEUE} has jobs queued on the broker given: use a broker nothing uses"
            )
    warmup = max(5, min(30, publishes // 10))
    pairs: list[Pair] = []
    try:
        for url in broker_urls:
            pairs += _bench_one(url, publishes, warmup)
    finally:
        IDLE.clear()
        for url in broker_urls:
            _purge(url)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        "$ agent-memory bench publish",
        f"{when} · publishes={publishes} per side and broker (+{warmup} warm-up), interleaved",
        machine(),
    ]
    for line in format_table(pairs, header):
        out(line)
    figures: dict[str, float] = {}
    for pair in pairs:
        figures |= pair.figures()
    return figures
