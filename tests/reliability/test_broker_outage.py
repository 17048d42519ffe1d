"""Jobs a consumer holds when Redis goes away come back when it reconnects, not ~68 min later.

Kombu hands a consumer's unacked jobs back when its channel closes; with Redis down that
fails and they wait in `unacked` for the visibility timeout. workers/broker.py remembers them
and the process's next channel to that broker hands them back. Driven at the kombu level on
the suite's private Redis (stopped and restarted for real), no timing involved: the visibility
timeout is an hour, so only the hand-back can bring the jobs back.
"""

from __future__ import annotations

import signal
import uuid
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue

from tests.support.services import Stack

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

ATOMIC = "workers.broker:Transport"
STOCK = "kombu.transport.redis:Transport"
HOUR = {"visibility_timeout": 3600}


def _hold_two_then_lose_redis(stack: Stack, transport: str) -> Queue:
    """Publish 3 jobs, take 2 without acking, then Redis stops and the consumer is closed."""
    name = f"outage.{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    with Connection(stack.redis_url, transport=STOCK) as conn:
        for n in range(3):
            conn.Producer().publish(
                {"n": n}, exchange=queue.exchange, routing_key=name, declare=[queue]
            )
    conn = Connection(stack.redis_url, transport=transport, transport_options=HOUR)
    held: list[Any] = []
    consumer = conn.Consumer(
        [queue], callbacks=[lambda _body, m: held.append(m)], accept=["json"], prefetch_count=2
    )
    consumer.consume()
    while len(held) < 2:
        conn.drain_events(timeout=5)
    stack.redis.stop(signal.SIGTERM)  # clean stop: the AOF has every write
    try:
        conn.collect()  # what Celery does with a broken connection: closing cannot reach Redis
    finally:
        stack.redis.start()
    return queue


@pytest.mark.parametrize("transport", [ATOMIC, STOCK])
def test_jobs_held_across_a_redis_restart_are_handed_back_on_reconnect(
    stack: Stack, transport: str
) -> None:
    queue = _hold_two_then_lose_redis(stack, transport)
    client = stack.client()
    assert client.llen(queue.name) == 1 and client.hlen("unacked") == 2  # survived the restart
    with Connection(stack.redis_url, transport=transport, transport_options=HOUR) as conn:
        conn.default_channel  # noqa: B018 - the process's next channel to this broker
        if transport == STOCK:  # kombu: they wait for the visibility timeout (an hour here)
            assert (client.llen(queue.name), client.hlen("unacked")) == (1, 2)
            return
        assert (client.llen(queue.name), client.hlen("unacked")) == (3, 0)
        got: list[int] = []

        def take(body: dict[str, Any], message: Any) -> None:
            got.append(body["n"])
            message.ack()

        with conn.Consumer([queue], callbacks=[take], accept=["json"]):
            while len(got) < 3:
                conn.drain_events(timeout=5)
    assert sorted(got) == [0, 1, 2]
    assert client.hlen("unacked") == 0
    client.close()
