"""`agent-memory bench broker`: what the atomic take costs against kombu's own BRPOP.

Both consumers run in the same process against the same Redis, on the same messages: take
(or BRPOP), decode, record unacked, ack. Rounds alternate so load drift hits both alike.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

from kombu import Connection, Exchange, Queue

from memory_core.fold.publisher import WORKER_PACKAGE

STOCK = "kombu.transport.redis:Transport"
ATOMIC = f"{WORKER_PACKAGE}.broker:Transport"


def _fill(url: str, queue: Queue, messages: int) -> None:
    with Connection(url, transport=STOCK) as conn:
        producer = conn.Producer(serializer="json")
        for n in range(messages):
            producer.publish(
                {"n": n, "turn": "x" * 200},
                exchange=queue.exchange,
                routing_key=queue.routing_key,
                declare=[queue] if n == 0 else [],
            )


def _drain(url: str, transport: str, queue: Queue, messages: int) -> float:
    """Seconds to consume and ack `messages` messages, one at a time (prefetch 1, as workers)."""
    done = 0

    def on_message(_: Any, message: Any) -> None:
        nonlocal done
        message.ack()
        done += 1

    with (
        Connection(url, transport=transport) as conn,
        conn.Consumer([queue], callbacks=[on_message], accept=["json"], prefetch_count=1),
    ):
        started = time.perf_counter()
        while done < messages:
            conn.drain_events(timeout=10)
        return time.perf_counter() - started


def bench_broker(url: str, messages: int = 5000, rounds: int = 3) -> dict[str, float]:
    rates: dict[str, list[float]] = {STOCK: [], ATOMIC: []}
    for _ in range(rounds):
        for transport in (STOCK, ATOMIC):
            name = f"bench.broker.{uuid.uuid4().hex[:8]}"
            queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
            _fill(url, queue, messages)
            rates[transport].append(messages / _drain(url, transport, queue, messages))
            with Connection(url, transport=STOCK) as conn:
                queue(conn.default_channel).delete()
    stock, atomic = (statistics.median(rates[t]) for t in (STOCK, ATOMIC))
    print(f"broker take, {messages} messages x {rounds} rounds (median msgs/s, consume + ack):")
    print(f"  kombu BRPOP (raw limit)  {stock:8.0f}")
    print(f"  atomic take              {atomic:8.0f}   {atomic / stock:.2f}x")
    print(f"command: agent-memory bench broker --broker-url {url} --messages {messages}")
    return {"stock_per_s": stock, "atomic_per_s": atomic, "ratio": atomic / stock}
