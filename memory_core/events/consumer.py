"""Reading the event stream: `EventConsumer` (a consumer group) and `tail_events` (the CLI).

Consumer contract (`EventConsumer`, at-least-once through a consumer group):
* `read` returns this consumer's own pending entries that are due again (read but not acked:
  the handler failed, or the process died), then new ones. An entry is due again only after it
  sat unacked for `retry_after_ms` x 2^(deliveries-1) (capped at 10 min): a handler failing
  for a moment is retried a few seconds later, not burnt through its deliveries at once.
* An entry delivered more than `max_deliveries` times is copied to the dead-letter stream
  (default `<stream>:dead`) with the fields `original_id`, `original_stream`, `deliveries`,
  `group`, `consumer`, `dead_lettered_at`, and acked.
* `claim_stale` takes over entries left idle by dead consumers (each claim is a delivery).
* Lag: streams are trimmed to about `MEMORY_EVENTS_MAXLEN` entries. A group that falls that far
  behind loses entries. `read` checks the group's lag every `lag_check_s` seconds: the gauge
  `memory_events_consumer_lag{stream,group}` and, once the lag passes half the cap (or entries
  were trimmed unread), a `memory.events_lag_at_risk` / `memory.events_lost` warning.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Generator
from typing import Any, cast

from redis.exceptions import ResponseError

from memory_core.events.stream import Event, _now_iso, _text
from memory_core.io.redis_kinds import SyncRedis
from memory_core.logs import get_logger
from memory_core.metrics import EVENTS_CONSUMER_LAG, EVENTS_LOST
from memory_core.settings import get_settings

_log = get_logger(__name__)
MAX_RETRY_WAIT_MS = 600_000


def _entries(response: Any) -> list[tuple[Any, Any]]:
    """(id, fields) pairs of an XREAD/XREADGROUP reply (RESP2 list, or RESP3 dict)."""
    if not response:
        return []
    if isinstance(response, dict):  # RESP3: {stream: [[(id, fields), ...]]}
        per_stream = [v[0] if v else [] for v in response.values()]
    else:  # RESP2: [[stream, [(id, fields), ...]], ...]
        per_stream = [item[1] for item in response]
    return [(e[0], e[1]) for entries in per_stream for e in entries]


class EventConsumer:
    """At-least-once reader of the event stream through a Redis consumer group."""

    def __init__(
        self,
        redis: SyncRedis,
        group: str,
        consumer: str,
        *,
        stream: str | None = None,
        max_deliveries: int = 5,
        dead_letter_stream: str | None = None,
        retry_after_ms: int = 5_000,
        lag_check_s: float = 30.0,
    ) -> None:
        if max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        if retry_after_ms < 0:
            raise ValueError("retry_after_ms must not be negative")
        self.redis = redis
        self.group = group
        self.consumer = consumer
        self.stream = stream if stream is not None else get_settings().memory_events_stream
        self.max_deliveries = max_deliveries
        self.dead_letter_stream = dead_letter_stream or f"{self.stream}:dead"
        self.retry_after_ms = retry_after_ms
        self.lag_check_s = lag_check_s
        self._lag_checked = -float("inf")

    def ensure_group(self, start_id: str = "0") -> bool:
        """Create the group (and the stream); True if created, False if it already existed."""
        try:
            self.redis.xgroup_create(self.stream, self.group, id=start_id, mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False
        return True

    def read(self, count: int = 10, block_ms: int | None = None) -> list[Event]:
        """Own pending entries that are due again; when there are none, new entries.

        `block_ms` applies to new entries only (None: do not block).
        """
        if time.monotonic() - self._lag_checked >= self.lag_check_s:
            self.check_lag()
        due = self._due_again(count)
        if due:
            return due
        new = self.redis.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms
        )
        return [Event.from_entry(eid, raw, deliveries=1) for eid, raw in _entries(new)]

    def wait_ms(self, deliveries: int) -> int:
        """How long an entry delivered `deliveries` times sits unacked before it is due again."""
        return int(min(self.retry_after_ms * 2 ** max(deliveries - 1, 0), MAX_RETRY_WAIT_MS))

    def _due_again(self, count: int) -> list[Event]:
        """Claim (a new delivery) this consumer's pending entries whose wait is over."""
        while True:
            rows = self.redis.xpending_range(
                self.stream,
                self.group,
                "-",
                "+",
                count,
                consumername=self.consumer,
                idle=self.retry_after_ms,
            )
            ids = [
                _text(r["message_id"])
                for r in rows
                if int(r["time_since_delivered"]) >= self.wait_ms(int(r["times_delivered"]))
            ]
            if not ids:
                return []
            claimed = self.redis.xclaim(
                self.stream, self.group, self.consumer, self.retry_after_ms, cast(list[Any], ids)
            )
            found = {_text(e[0]): e for e in claimed if e and e[1]}
            gone = [i for i in ids if i not in found]
            if gone:  # trimmed before it was handled
                self._lost(gone)
            events = self._screen([(found[i][0], found[i][1]) for i in ids if i in found])
            if events or not found:
                return events
            # every claimed entry was dead-lettered: look again

    def ack(self, *ids: str) -> int:
        return int(self.redis.xack(self.stream, self.group, *ids)) if ids else 0

    def claim_stale(self, min_idle_ms: int, count: int = 100) -> list[Event]:
        """Take over up to `count` entries pending (in any consumer) for at least `min_idle_ms`."""
        claimed: list[tuple[Any, Any]] = []
        cursor = "0-0"
        while len(claimed) < count:
            reply = self.redis.xautoclaim(
                self.stream, self.group, self.consumer, min_idle_ms, cursor, count - len(claimed)
            )
            claimed.extend((e[0], e[1]) for e in reply[1])
            cursor = _text(reply[0])
            if cursor == "0-0":
                break
        return self._screen(claimed) if claimed else []

    def check_lag(self) -> int | None:
        """Entries of the stream this group has not read yet (None: unknown, e.g. Redis < 7).

        Sets the lag gauge; warns when the lag puts unread entries at risk of being trimmed
        (over half of `MEMORY_EVENTS_MAXLEN`) and when entries were trimmed before the group
        read them.
        """
        self._lag_checked = time.monotonic()
        try:
            groups = self.redis.xinfo_groups(self.stream)
            info = next((g for g in groups if _text(g.get("name")) == self.group), None)
            first = self.redis.xinfo_stream(self.stream).get("first-entry")
        except ResponseError:  # no stream yet
            return None
        if info is None:
            return None
        lag = info.get("lag")
        maxlen = get_settings().memory_events_maxlen
        if lag is not None:
            EVENTS_CONSUMER_LAG.labels(self.stream, self.group).set(int(lag))
            if int(lag) > maxlen // 2:
                _log.warning(
                    "memory.events_lag_at_risk",
                    stream=self.stream,
                    group=self.group,
                    lag=int(lag),
                    maxlen=maxlen,
                )
        last = _text(info.get("last-delivered-id") or "0-0")
        if first and _id_tuple(last) < _id_tuple(_text(first[0])) and _id_tuple(last) != (0, 0):
            # The group's position precedes the oldest entry: what lay between was trimmed.
            _log.warning(
                "memory.events_lost",
                stream=self.stream,
                group=self.group,
                last_read=last,
                oldest=_text(first[0]),
            )
            EVENTS_LOST.labels(self.stream, self.group).inc()
        return None if lag is None else int(lag)

    def tail(
        self, follow: bool = False, count: int = 10, block_ms: int = 5000
    ) -> Generator[Event, None, None]:
        """Consume and ack: one read of up to `count` entries, or forever when `follow`.

        An entry is acked when the caller asks for the next one, so an entry whose handling
        was interrupted stays pending and is delivered again.
        """
        self.ensure_group()
        while True:
            for event in self.read(count=count, block_ms=block_ms if follow else None):
                yield event
                self.ack(event.id)
            if not follow:
                return

    def _lost(self, ids: list[str]) -> None:
        _log.warning(
            "memory.event_trimmed",
            stream=self.stream,
            group=self.group,
            ids=ids,
        )
        EVENTS_LOST.labels(self.stream, self.group).inc(len(ids))
        self.ack(*ids)

    def _screen(self, entries: list[tuple[Any, Any]]) -> list[Event]:
        """Ack entries trimmed from the stream, dead-letter over-delivered ones, parse the rest."""
        gone = [_text(eid) for eid, raw in entries if not raw]
        live = [(eid, raw) for eid, raw in entries if raw]
        if gone:
            self._lost(gone)
        if not live:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for eid, _ in live:
            pipe.xpending_range(self.stream, self.group, eid, eid, 1, consumername=self.consumer)
        counts = [int(rows[0]["times_delivered"]) if rows else 0 for rows in pipe.execute()]
        events = [Event.from_entry(eid, raw, n) for (eid, raw), n in zip(live, counts, strict=True)]
        dead = [e for e in events if e.deliveries > self.max_deliveries]
        if dead:
            self._dead_letter(dead)
        return [e for e in events if e.deliveries <= self.max_deliveries]

    def _dead_letter(self, events: list[Event]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        maxlen = get_settings().memory_events_maxlen
        for e in events:
            meta = {
                "original_id": e.id,
                "original_stream": self.stream,
                "deliveries": str(e.deliveries),
                "group": self.group,
                "consumer": self.consumer,
                "dead_lettered_at": _now_iso(),
            }
            pipe.xadd(self.dead_letter_stream, cast(Any, {**e.fields, **meta}), maxlen=maxlen)
        # The XADDs, then the ack, in two round trips (dead-lettering is rare): a failed ack
        # re-delivers, it never loses the entry. One pipeline would not keep that order on a
        # Redis Cluster, where the two streams may live on different nodes.
        pipe.execute()
        self.ack(*(e.id for e in events))
        _log.warning(
            "memory.event_dead_lettered",
            stream=self.dead_letter_stream,
            ids=[e.id for e in events],
        )


def _id_tuple(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


def tail_events(
    redis: SyncRedis,
    *,
    stream: str | None = None,
    group: str | None = None,
    consumer: str | None = None,
    follow: bool = False,
    count: int = 10,
    block_ms: int = 5000,
    from_start: bool = False,
) -> Generator[Event, None, None]:
    """What `agent-memory events tail` prints.

    Without a group: a plain reader that changes nothing — the last `count` entries (or, with
    `from_start`, every entry from the oldest), then with `follow` new entries as they arrive.
    With a group: `EventConsumer.tail` (consume and ack) as `consumer` (default `cli-<host>`).
    """
    stream = stream if stream is not None else get_settings().memory_events_stream
    if group:
        name = consumer or f"cli-{socket.gethostname()}"
        yield from EventConsumer(redis, group, name, stream=stream).tail(follow, count, block_ms)
        return
    last_id = "0-0"
    if from_start:
        while page := redis.xrange(stream, min=f"({last_id}", count=count):
            for eid, raw in page:
                yield Event.from_entry(eid, raw)
            last_id = _text(page[-1][0])
    else:
        for eid, raw in reversed(cast(list[Any], redis.xrevrange(stream, count=count))):
            yield Event.from_entry(eid, raw)
            last_id = _text(eid)
    while follow:
        for eid, raw in _entries(redis.xread({stream: last_id}, count=count, block=block_ms)):
            yield Event.from_entry(eid, raw)
            last_id = _text(eid)
