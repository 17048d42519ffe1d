"""A Redis transport whose consumers cannot lose a message they were handed.

Stock kombu takes a message with BRPOP and only then, from the worker, records it in the
`unacked` hash that redelivers it if the worker dies. A worker killed with -9 between those
two steps (the reply in its socket or its memory) loses the message for good: about one job
in four whole-worker kills under load did (tests/reliability/test_crashes.py).

Here the take is one Lua script: pop the first waiting message *and* record it in `unacked`
/ `unacked_index`, exactly as kombu's QoS would, in one atomic step on the server. From then
on a dead worker's message is redelivered by kombu's own sweep after `visibility_timeout`.
A script cannot block, so an idle consumer waits with `BLMOVE q q RIGHT RIGHT`, which moves
the tail of a list onto itself: it blocks until the list has a message and takes nothing.
A blocking command waits on one list, so a consumer of several queues waits on its first one
(the first of `-Q`: `memory.finalize` in every shape we ship), where a job is seen the moment
it lands, and at most `reliable_idle_wait` seconds (0.5) at a time: a job on another queue of
an idle worker is seen when that wait ends. (It used to rotate the wait over the queues, so a
finalize pushed to an idle combined worker waited for the fold queue's half second: 0.4-0.5 s
per idle round in `bench workers`.) A busy worker takes without waiting. Needs Redis >= 6.2
(BLMOVE); on older servers it logs a warning and behaves like stock kombu.

Publishing is unchanged: producers with stock kombu and this consumer share one queue format.
`workers.app` installs it for `redis://` brokers (`use_atomic_take`).
"""

from __future__ import annotations

import hashlib
import threading
from queue import Empty
from time import monotonic
from typing import Any

from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memory_core.logs import get_logger

log = get_logger(__name__)

# KEYS: the queue lists in take order, then the unacked hash and the unacked index.
# The stored entry is kombu's own ([payload, exchange, routing_key]); the payload is spliced
# in as the original text, never re-encoded (cjson would turn [] into {}).
TAKE_SCRIPT = """
local n = #KEYS - 2
for i = 1, n do
  local item = redis.call('RPOP', KEYS[i])
  if item then
    local recorded = 0
    local ok, msg = false, nil
    if ARGV[i] == '1' then ok, msg = pcall(cjson.decode, item) end
    if ok and type(msg) == 'table' and type(msg.properties) == 'table' then
      local props = msg.properties
      local tag = props.delivery_tag
      local info = props.delivery_info
      if type(tag) == 'string' and type(info) == 'table' then
        local t = redis.call('TIME')
        redis.call('ZADD', KEYS[n + 2], tonumber(t[1]) + tonumber(t[2]) / 1000000, tag)
        redis.call('HSET', KEYS[n + 1], tag, '[' .. item .. ',' .. cjson.encode(info.exchange)
          .. ',' .. cjson.encode(info.routing_key) .. ']')
        recorded = 1
      end
    end
    return {KEYS[i], item, recorded}
  end
end
return false
"""
TAKE_SHA = hashlib.sha1(TAKE_SCRIPT.encode(), usedforsecurity=False).hexdigest()  # EVALSHA name
MIN_REDIS = (6, 2)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


# Jobs whose hand-back met a lost connection, by broker. Kombu would leave them in `unacked`
# for the visibility timeout (~68 min); this process's next channel to that broker hands them
# back as soon as it is connected (Celery has dropped them from its own state by then).
_DEFERRED: dict[tuple[Any, ...], set[str]] = {}
_DEFERRED_LOCK = threading.Lock()
HAND_BACK_ERRORS = (AttributeError, OSError, RedisConnectionError, RedisTimeoutError)


class QoS(kombu_redis.QoS):
    def restore_unacked(self, client: Any = None) -> None:
        try:
            super().restore_unacked(client)
        except HAND_BACK_ERRORS as exc:
            # A collected or broken connection (a Redis restart): hand them back later.
            tags = {str(tag) for tag in self._delivered}
            self._delivered.clear()
            self.channel._defer_hand_back(tags, exc)

    def append(self, message: Any, delivery_tag: Any) -> None:
        if self.channel._recorded_by_take == delivery_tag:
            # The take already wrote this very entry in Redis: only the in-memory bookkeeping.
            virtual.QoS.append(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel with an atomic take (see the module docstring)."""

    QoS = QoS
    _recorded_by_take: str | None = None
    _broker: tuple[Any, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._no_ack_queues: set[str] = set()  # their messages are never recorded as unacked
        super().__init__(*args, **kwargs)  # pings Redis: raises while it is down
        info = self.connection.client
        self._broker = (info.hostname, info.port, info.virtual_host, self.global_keyprefix)
        self._hand_back_deferred()

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        (self._no_ack_queues.add if no_ack else self._no_ack_queues.discard)(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def _defer_hand_back(self, tags: set[str], error: BaseException) -> None:
        if not tags or not self._broker:
            return
        with _DEFERRED_LOCK:
            _DEFERRED.setdefault(self._broker, set()).update(tags)
        log.warning("memory.broker_hand_back_deferred", jobs=len(tags), error=repr(error))

    def _hand_back_deferred(self) -> None:
        with _DEFERRED_LOCK:
            tags = _DEFERRED.pop(self._broker, set())
        if not tags:
            return
        try:
            with self.conn_or_acquire() as client:
                for tag in tags:  # a tag acked or restored meanwhile is a no-op
                    self.qos.restore_by_tag(tag, client=client)
        except HAND_BACK_ERRORS as exc:
            self._defer_hand_back(tags, exc)  # down again: the next channel tries
            return
        log.info("memory.broker_handed_back", jobs=len(tags))

    reliable_idle_wait = 0.5
    from_transport_options = (*kombu_redis.Channel.from_transport_options, "reliable_idle_wait")  # type: ignore[assignment]

    _reliable: bool | None = None  # None: not checked yet
    _script_cached = False  # the first take of a channel sends the text: never a NOSCRIPT miss
    _sent: tuple[str, str | None] | None = None  # ("take", None) or ("wait", queue)
    _wait_next = False

    def _take_is_atomic(self) -> bool:
        if self._reliable is None:
            with self.conn_or_acquire() as client:
                version = str(client.info("server").get("redis_version", "0"))
            self._reliable = _version(version) >= MIN_REDIS
            if not self._reliable:
                log.warning(
                    "memory.broker_take_not_atomic",
                    redis_version=version,
                    why="BLMOVE needs Redis >= 6.2; a worker killed -9 may lose one message",
                )
        return self._reliable

    def _brpop_start(self, timeout: float | None = None) -> None:
        if not self._take_is_atomic():
            return super()._brpop_start(timeout)
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        prefix = self.global_keyprefix or ""
        if self._wait_next:
            wait = self.brpop_timeout if timeout is None else timeout
            if len(queues) > 1:
                wait = min(wait or self.reliable_idle_wait, self.reliable_idle_wait)
            first = self._first_queue(queues)
            key = prefix + self._q_for_pri(first, 0)
            args: list[Any] = ["BLMOVE", key, key, "RIGHT", "RIGHT", wait or 0]
            self._sent = ("wait", first)
        else:
            taken = [(q, pri) for pri in self.priority_steps for q in queues]
            keys = [self._q_for_pri(q, pri) for q, pri in taken]
            keys += [self.unacked_key, self.unacked_index_key]
            keys = [prefix + k for k in keys]
            record = ["0" if q in self._no_ack_queues else "1" for q, _ in taken]
            head = ["EVALSHA", TAKE_SHA] if self._script_cached else ["EVAL", TAKE_SCRIPT]
            args = [*head, len(keys), *keys, *record]
            self._sent = ("take", None)
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()  # type: ignore[assignment]
        self.client.connection.send_command(*args)

    def _first_queue(self, queues: list[str]) -> str:
        """The queue an idle consumer waits on: the first it consumes (in `-Q` order), not the
        take's round-robin order, which moves a queue that just served to the back."""
        return next((q for q in self._active_queues if q in queues), queues[0])

    def _brpop_read(self, **options: Any) -> bool:
        sent, self._sent = self._sent, None
        if sent is None:
            return super()._brpop_read(**options)
        kind, _queue = sent
        try:
            reply = self._read_reply(kind, **options)
            if kind == "wait":
                self._wait_next = False  # a job, or the wait's end: take from every queue
                raise Empty()
            if not reply:
                self._wait_next = True
                raise Empty()
            self._wait_next = False
            key, item, recorded = reply
            dest = bytes_to_str(key)[len(self.global_keyprefix or "") :].rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            payload = loads(bytes_to_str(item))
            if recorded:
                self._recorded_by_take = payload["properties"]["delivery_tag"]
            try:
                self.connection._deliver(payload, dest)
            finally:
                self._recorded_by_take = None
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]
            self._flush_brpop_reauth()

    def _read_reply(self, kind: str, **options: Any) -> Any:
        command = "EVALSHA" if kind == "take" else "BLMOVE"
        try:
            reply = self.client.parse_response(self.client.connection, command, **options)
        except self.connection_errors:
            self.client.connection.disconnect()  # the next poll reconnects
            raise
        except NoScriptError:
            self._script_cached = False  # a restarted server: send the script text once
            raise Empty() from None
        except ResponseError as exc:
            if kind == "wait":  # a server without BLMOVE (e.g. renamed commands)
                log.warning("memory.broker_wait_failed", error=str(exc))
                self._reliable = False
                raise Empty() from None
            raise
        if kind == "take":
            self._script_cached = True  # a successful EVAL loaded it
        return reply

    # Acks after a lost connection. Celery collects a broken connection (the transport's
    # client becomes None) and reconnects, but a task that finished meanwhile still acks or
    # rejects through its old channel; kombu then raised AttributeError out of the event loop,
    # an "Unrecoverable error" that killed the worker (found by
    # tests/reliability/test_outages.py, Redis restart under load). The message is still in
    # `unacked`, so it is redelivered after the visibility timeout; finalize and fold are
    # idempotent.
    def _collected(self) -> bool:
        return getattr(self.connection, "client", None) is None

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        if self._collected():
            log.warning("memory.broker_ack_after_connection_loss", delivery_tag=delivery_tag)
            return
        super().basic_ack(delivery_tag, multiple=multiple)

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if self._collected():
            log.warning("memory.broker_reject_after_connection_loss", delivery_tag=delivery_tag)
            return
        super().basic_reject(delivery_tag, requeue=requeue)


class Transport(kombu_redis.Transport):
    Channel = Channel


def use_atomic_take() -> None:
    """Make `redis://` mean this transport in this process (workers, Flower, our producers).

    Through kombu's alias table rather than Celery's `broker_transport`, so URLs keep their
    `redis://` scheme (Flower picks its queue-length client by it). `rediss://` (TLS) and other
    brokers keep kombu's transports.
    """
    kombu_transport.TRANSPORT_ALIASES["redis"] = f"{__name__}:Transport"
    kombu_transport._transport_cache.pop("redis", None)
