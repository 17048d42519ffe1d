"""workers/broker.py: a consumer cannot lose a message it was handed, whenever it dies.

Real Redis, real kombu producers and consumers; the consumer's death is a real SIGKILL of a
subprocess in the window that loses messages with stock kombu (reply sent, not yet read).
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu import Connection, Exchange, Queue
from kombu.transport import get_transport_cls
from kombu.transport.redis import Transport as StockTransport
from kombu.utils.json import loads

from memory_core.bench.broker import bench_broker
from memory_core.devservices.poll import wait_for
from memory_core.settings import get_settings
from workers.app import make_app
from workers.broker import Channel as ReliableChannel

TRANSPORT = "workers.broker:Transport"
STOCK = "kombu.transport.redis:Transport"


def _queue(name: str | None = None) -> Queue:
    name = name or f"test.broker.{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def _publish(url: str, queue: Queue, body: Any, **options: Any) -> None:
    with Connection(url, transport_options=options) as conn:  # stock kombu, like any producer
        conn.Producer().publish(
            body,
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            declare=[queue],
            serializer="json",
        )


def _take_one(conn: Connection, queues: list[Queue], timeout_s: float = 10) -> Any:
    got: list[Any] = []

    def delivered() -> bool:
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=1)
        return bool(got)

    with conn.Consumer(
        queues, callbacks=[lambda body, msg: got.append((body, msg))], accept=["json"]
    ):
        wait_for(delivered, timeout_s, "a message to be delivered", interval_s=0)
    return got[0]


@pytest.fixture
def url() -> str:
    return get_settings().celery_broker_url


@pytest.fixture
def broker(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    yield client
    client.close()


KILLED_MID_TAKE = """
import os, signal, sys, time
from kombu import Connection, Exchange, Queue
name = sys.argv[2]
conn = Connection(sys.argv[1], transport=sys.argv[3])
channel = conn.default_channel
queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
channel.basic_consume(queue.name, False, lambda message: None, "ctag")
conn.transport.cycle._register_BRPOP(channel)  # sends the take (or BRPOP)
time.sleep(0.3)                   # ... the server has answered; the reply is unread
os.kill(os.getpid(), signal.SIGKILL)
"""


def _die_mid_take(url: str, queue: Queue, transport: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", KILLED_MID_TAKE, url, queue.name, transport],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -9, done.stderr.decode()


def _find_unacked(broker: redis.Redis, body: Any) -> tuple[bytes | str, list[Any]] | None:
    for tag, entry in broker.hgetall("unacked").items():
        message, exchange, routing_key = loads(entry)
        if loads(base64.b64decode(message["body"])) == body:  # kombu's body_encoding
            return tag, [message, exchange, routing_key]
    return None


def test_consumer_killed_between_take_and_read_keeps_the_message_for_redelivery(
    url: str, broker: redis.Redis
) -> None:
    queue = _queue()
    body = {"turn": uuid.uuid4().hex}
    _publish(url, queue, body)
    _die_mid_take(url, queue, TRANSPORT)

    assert broker.llen(queue.name) == 0  # it was taken ...
    found = _find_unacked(broker, body)
    assert found is not None, "taken but not recorded: lost"  # ... and recorded atomically
    tag, (_, exchange, routing_key) = found
    assert broker.zscore("unacked_index", tag) is not None
    assert (exchange, routing_key) == (queue.exchange.name, queue.routing_key)

    # kombu's own sweep hands it back once the visibility timeout has passed ...
    with Connection(url, transport_options={"visibility_timeout": 0}) as conn:
        conn.default_channel.qos.restore_visible()
    assert broker.llen(queue.name) == 1
    # ... and the next consumer gets it, marked redelivered.
    with Connection(url, transport=TRANSPORT) as conn:
        got, message = _take_one(conn, [queue])
        assert got == body and message.delivery_info["redelivered"] is True
        message.ack()
    assert broker.hget("unacked", tag) is None


def test_stock_kombu_loses_a_message_in_the_same_window(url: str, broker: redis.Redis) -> None:
    """Why workers/broker.py exists: the same death with stock kombu leaves no trace."""
    queue = _queue()
    body = {"turn": uuid.uuid4().hex}
    _publish(url, queue, body)
    _die_mid_take(url, queue, STOCK)
    assert broker.llen(queue.name) == 0
    assert _find_unacked(broker, body) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=JSON)
def test_taken_message_and_its_unacked_entry_are_exactly_what_kombu_would_store(
    url: str, broker: redis.Redis, body: Any
) -> None:
    """The script splices the payload in as text: [] stays [], {} stays {}, unicode intact."""
    queue = _queue("test.broker.property")
    _publish(url, queue, body)
    with Connection(url, transport=TRANSPORT) as conn:
        got, message = _take_one(conn, [queue])
        assert got == body
        entry = broker.hget("unacked", message.delivery_tag)
        assert entry is not None
        assert loads(entry) == [message._raw, queue.exchange.name, queue.routing_key]
        message.ack()
    assert broker.hget("unacked", message.delivery_tag) is None
    assert broker.zscore("unacked_index", message.delivery_tag) is None


def test_no_ack_consumer_takes_without_recording_anything_as_unacked(
    url: str, broker: redis.Redis
) -> None:
    """Celery's inspect/control replies are consumed no_ack: nothing may wait to be acked."""
    queue = _queue()
    body = {"reply": uuid.uuid4().hex}
    _publish(url, queue, body)
    got: list[Any] = []
    with (
        Connection(url, transport=TRANSPORT) as conn,
        conn.Consumer(
            [queue], callbacks=[lambda b, _m: got.append(b)], accept=["json"], no_ack=True
        ),
    ):
        while not got:
            conn.drain_events(timeout=5)
    assert got == [body]
    assert _find_unacked(broker, body) is None
    assert broker.llen(queue.name) == 0


def test_idle_consumer_of_two_queues_gets_a_message_on_the_one_it_is_not_waiting_on(
    url: str,
) -> None:
    first, second = _queue(), _queue()
    with Connection(url, transport=TRANSPORT) as conn:
        channel = conn.default_channel
        sent: list[tuple[str, str | None]] = []
        start = channel._brpop_start

        def recording_start(timeout: float | None = None) -> None:
            start(timeout)
            sent.append(channel._sent)

        channel._brpop_start = recording_start
        with conn.Consumer([first, second], callbacks=[], accept=["json"]):
            for _ in range(4):  # idle: take finds nothing, then it waits (BLMOVE) on one queue
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.3)
        waited = [queue for kind, queue in sent if kind == "wait"]
        assert waited and sent[0] == ("take", None)
        assert set(waited) == {first.name}  # the first queue it consumes, every time
        for queue in (second, first, second):
            body = {"queue": queue.name}
            _publish(url, queue, body)
            got, message = _take_one(conn, [first, second])
            assert got == body
            message.ack()


def test_idle_consumer_of_two_queues_is_woken_by_a_job_on_its_first_queue(url: str) -> None:
    """The combined worker's shape (-Q memory.finalize,memory.fold), idle: a job on its first
    queue ends the wait itself, however long the wait's bound (here 30 s); it used to rotate
    the wait, so a finalize could sit out the fold queue's wait."""
    first, second = _queue(), _queue()
    options = {"reliable_idle_wait": 30, "polling_interval": 30}  # the wait's bound: 30 s
    with Connection(url, transport=TRANSPORT, transport_options=options) as conn:
        channel = conn.default_channel
        replies: list[tuple[str, bool]] = []
        read = channel._read_reply

        def recording_read(kind: str, **opts: Any) -> Any:
            reply = read(kind, **opts)
            replies.append((kind, bool(reply)))
            return reply

        channel._read_reply = recording_read
        got: list[Any] = []

        def delivered(n: int) -> bool:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=1)
            return len(got) == n

        _publish(url, first, {"n": 0})  # served by the first queue: the take's order rotates
        with conn.Consumer(
            [first, second], callbacks=[lambda b, m: got.append((b, m))], accept=["json"]
        ):
            wait_for(lambda: delivered(1), 20, "the first job", interval_s=0)
            for _ in range(3):  # the empty take, then the wait in flight
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.2)
            assert replies[-1] == ("take", False)  # idle and waiting: no reply yet
            _publish(url, first, {"n": 1})
            wait_for(lambda: delivered(2), 20, "the job on the first queue", interval_s=0)
        assert [body for body, _ in got] == [{"n": 0}, {"n": 1}]
        for _, message in got:
            message.ack()
        # The wait returned the job (not its 30 s bound), and the next take delivered it.
        assert replies[-3:] == [("take", False), ("wait", True), ("take", True)]


def test_take_survives_a_flushed_script_cache(url: str, broker: redis.Redis) -> None:
    """A restarted Redis has no scripts: NOSCRIPT makes the consumer send the script text."""
    queue = _queue()
    with Connection(url, transport=TRANSPORT) as conn:
        _publish(url, queue, {"n": 1})
        _take_one(conn, [queue])[1].ack()
        broker.script_flush()
        _publish(url, queue, {"n": 2})
        got, message = _take_one(conn, [queue])
        assert got == {"n": 2}
        message.ack()


def test_global_keyprefix_is_applied_to_the_queue_and_the_unacked_keys(
    url: str, broker: redis.Redis
) -> None:
    prefix = f"pfx{uuid.uuid4().hex[:6]}:"
    queue = _queue()
    _publish(url, queue, {"p": 1}, global_keyprefix=prefix)
    assert broker.llen(prefix + queue.name) == 1
    with Connection(url, transport=TRANSPORT, transport_options={"global_keyprefix": prefix}) as c:
        got, message = _take_one(c, [queue])
        assert got == {"p": 1}
        assert broker.hget(prefix + "unacked", message.delivery_tag) is not None
        message.ack()
        assert broker.hget(prefix + "unacked", message.delivery_tag) is None


def test_ack_through_a_channel_whose_connection_was_collected_leaves_it_for_redelivery(
    url: str, broker: redis.Redis
) -> None:
    """Celery acks a task that finished during a broker outage through the collected channel."""
    queue = _queue()
    _publish(url, queue, {"late": 1})
    conn = Connection(url, transport=TRANSPORT)
    _, message = _take_one(conn, [queue])
    conn.collect()  # what Celery does with a broken broker connection
    message.ack()  # kombu raised AttributeError here, out of the worker's event loop
    # Not acked, so not gone: handed back by the close (Redis up here), or left in `unacked`
    # for the sweep when the close could not reach Redis (the outage case).
    held = broker.hget("unacked", message.delivery_tag) is not None
    assert held + broker.llen(queue.name) == 1
    with Connection(url, transport_options={"visibility_timeout": 0}) as sweeper:
        sweeper.default_channel.qos.restore_visible()
    with Connection(url, transport=TRANSPORT) as fresh:
        got, again = _take_one(fresh, [queue])
        assert got == {"late": 1} and again.delivery_info["redelivered"] is True
        again.ack()


def test_worker_app_consumes_redis_with_the_atomic_take_and_keeps_the_url_scheme() -> None:
    with make_app().connection_for_read() as conn:  # the test broker is redis://
        assert isinstance(conn.default_channel, ReliableChannel)
        assert conn.as_uri().startswith("redis://")  # Flower and logs still see redis://
    assert get_transport_cls("rediss") is StockTransport  # TLS keeps kombu's own


def test_bench_broker_consumes_everything_both_ways_and_leaves_nothing(
    url: str, broker: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    unacked_before = broker.hlen("unacked")
    figures = bench_broker(url, messages=30, rounds=1)
    assert figures["stock_per_s"] > 0 and figures["atomic_per_s"] > 0
    assert figures["ratio"] == figures["atomic_per_s"] / figures["stock_per_s"]
    out = capsys.readouterr().out
    assert f"command: agent-memory bench broker --broker-url {url} --messages 30" in out
    assert not broker.keys("bench.broker.*")  # its queues are deleted
    assert broker.hlen("unacked") == unacked_before  # every message was acked
