"""The memory event stream against a real Redis: field contract, trimming, outage, consumer groups.

Every test uses its own stream name and deletes it (and its dead-letter stream) afterwards;
other test runs share the Redis server, so nothing here flushes a database.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any, cast
from uuid import uuid4

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from redis.backoff import NoBackoff
from redis.retry import Retry

from memory_core.devservices.ports import free_port
from memory_core.events import (
    EVENT_FIELDS,
    MAX_ERROR_CHARS,
    MEMORY_FINALIZE_REJECTED,
    MEMORY_SUMMARIZATION_FAILED,
    MEMORY_SUMMARIZED,
    Event,
    EventConsumer,
    emit_event,
    format_event,
    tail_events,
)
from memory_core.settings import get_settings


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(get_settings().redis_url, socket_timeout=10)
    yield client
    client.close()


@pytest.fixture
def stream(events_stream: str) -> str:
    """The test's own stream (fixture `events_stream`: deleted afterwards, with its dead-letter
    stream), under the short name this module uses throughout."""
    return events_stream


def _raw(r: redis.Redis, stream: str) -> list[tuple[str, dict[str, str]]]:
    # `r` has no decode_responses: ids, keys and values come back as bytes.
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], r.xrange(stream))
    return [
        (eid.decode(), {k.decode(): v.decode() for k, v in fields.items()})
        for eid, fields in entries
    ]


def _emit_n(r: redis.Redis, stream: str, n: int) -> list[str]:
    ids = [emit_event(r, MEMORY_SUMMARIZED, thread_id=f"t{i}", stream=stream) for i in range(n)]
    assert all(ids)
    return [i for i in ids if i]


def _pending(r: redis.Redis, stream: str, group: str) -> dict[str, tuple[str, int]]:
    # `r` has no decode_responses: ids and consumer names are bytes, counts int.
    rows = cast(list[dict[str, Any]], r.xpending_range(stream, group, "-", "+", 1000))
    return {
        row["message_id"].decode(): (row["consumer"].decode(), row["times_delivered"])
        for row in rows
    }


def test_event_names() -> None:
    assert MEMORY_SUMMARIZATION_FAILED == "memory_summarization_failed"
    assert MEMORY_SUMMARIZED == "memory_summarized"
    assert MEMORY_FINALIZE_REJECTED == "memory_finalize_rejected"


def test_fields_exactly_as_documented(r: redis.Redis, stream: str) -> None:
    before = datetime.now(UTC)
    eid = emit_event(
        r,
        MEMORY_SUMMARIZATION_FAILED,
        thread_id="thread-1",
        session_id="session-1",
        attempt=3,
        error="LLM timed out",
        retry_in_s=240,
        stream=stream,
    )
    emit_event(r, MEMORY_SUMMARIZED, thread_id="thread-1", stream=stream)
    (first_id, first), (_, second) = _raw(r, stream)
    assert first_id == eid
    assert list(first) == list(EVENT_FIELDS)
    assert list(EVENT_FIELDS) == [
        "event", "thread_id", "session_id", "attempt", "error", "retry_in_s", "at"
    ]  # fmt: skip
    assert first["event"] == "memory_summarization_failed"
    assert (first["thread_id"], first["session_id"]) == ("thread-1", "session-1")
    assert (first["attempt"], first["error"], first["retry_in_s"]) == ("3", "LLM timed out", "240")
    at = datetime.fromisoformat(first["at"])
    assert at.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= at <= datetime.now(UTC) + timedelta(seconds=1)
    assert list(second) == list(EVENT_FIELDS)
    assert (second["session_id"], second["attempt"], second["error"]) == ("", "0", "")
    assert second["retry_in_s"] == ""  # unknown retry delay: empty string


def test_extra_fields_follow_and_never_override(r: redis.Redis, stream: str) -> None:
    emit_event(r, MEMORY_FINALIZE_REJECTED, stream=stream, reason="bad ids", at="forged")
    [(_, fields)] = _raw(r, stream)
    assert list(fields) == [*EVENT_FIELDS, "reason"]
    assert fields["reason"] == "bad ids"
    assert fields["at"] != "forged"


def test_long_error_truncated_and_surrogates_replaced(r: redis.Redis, stream: str) -> None:
    emit_event(r, MEMORY_SUMMARIZATION_FAILED, error="x" * 10_000, stream=stream)
    bad_text = "bad \ud800 text"
    emit_event(r, MEMORY_SUMMARIZATION_FAILED, error=bad_text, thread_id="\udfff", stream=stream)
    (_, long), (_, bad) = _raw(r, stream)
    assert len(long["error"]) == MAX_ERROR_CHARS
    assert long["error"].endswith("...")
    assert bad["error"] == "bad \ufffd text"
    assert bad["thread_id"] == "\ufffd"


def test_approximate_maxlen_trims_a_flooded_stream(r: redis.Redis, stream: str) -> None:
    for i in range(1000):
        assert emit_event(r, MEMORY_SUMMARIZED, thread_id=str(i), stream=stream, maxlen=100)
    length = r.xlen(stream)
    assert 100 <= length < 1000
    newest = _raw(r, stream)[-1][1]
    assert newest["thread_id"] == "999"  # trimming drops the oldest entries


def _down_client(port: int) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_connect_timeout=0.5,
        socket_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )


def test_emit_never_raises_when_redis_is_down(caplog: pytest.LogCaptureFixture) -> None:
    client = _down_client(free_port())  # nothing listens there: connection refused
    with caplog.at_level(logging.DEBUG, logger="memory_core"):
        assert emit_event(client, MEMORY_SUMMARIZATION_FAILED, thread_id="t", stream="s") is None
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "memory.event_emit_failed event_name=memory_summarization_failed error=ConnectionError"
    )


def test_emit_returns_promptly_when_redis_hangs() -> None:
    with socket.socket() as server:  # accepts connections (backlog) but never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        client = _down_client(server.getsockname()[1])
        started = time.monotonic()
        assert emit_event(client, MEMORY_SUMMARIZATION_FAILED, stream="s") is None
        assert time.monotonic() - started < 3


def test_ensure_group_is_idempotent_and_creates_the_stream(r: redis.Redis, stream: str) -> None:
    consumer = EventConsumer(r, "g", "c1", stream=stream)
    assert consumer.ensure_group() is True
    assert consumer.ensure_group() is False
    assert r.exists(stream) == 1
    assert consumer.read() == []
    assert consumer.dead_letter_stream == f"{stream}:dead"


def test_two_consumers_in_a_group_split_entries(r: redis.Redis, stream: str) -> None:
    ids = _emit_n(r, stream, 20)
    c1 = EventConsumer(r, "g", "c1", stream=stream)
    c2 = EventConsumer(r, "g", "c2", stream=stream)
    c1.ensure_group()
    seen: dict[str, list[str]] = {"c1": [], "c2": []}
    while True:
        batch1, batch2 = c1.read(count=3), c2.read(count=3)
        if not batch1 and not batch2:
            break
        for consumer, batch in ((c1, batch1), (c2, batch2)):
            seen[consumer.consumer].extend(e.id for e in batch)
            assert consumer.ack(*(e.id for e in batch)) == len(batch)
    assert seen["c1"] and seen["c2"]
    assert not set(seen["c1"]) & set(seen["c2"])
    assert sorted(seen["c1"] + seen["c2"]) == sorted(ids)
    assert _pending(r, stream, "g") == {}


def test_unacked_entries_come_back_to_the_same_consumer_after_restart(
    r: redis.Redis, stream: str
) -> None:
    ids = _emit_n(r, stream, 5)
    first = EventConsumer(r, "g", "worker-1", stream=stream)
    first.ensure_group()
    got = first.read(count=3)
    assert [e.id for e in got] == ids[:3]
    assert all(e.deliveries == 1 for e in got)
    # crash: no ack. Another consumer of the group only gets the rest.
    other = EventConsumer(r, "g", "worker-2", stream=stream)
    assert [e.id for e in other.read(count=10)] == ids[3:]
    other.ack(*ids[3:])
    # Restarted, and configured to retry its own pending entries at once.
    restarted = EventConsumer(r, "g", "worker-1", stream=stream, retry_after_ms=0)
    again = restarted.read(count=10)
    assert [e.id for e in again] == ids[:3]
    assert [e.thread_id for e in again] == ["t0", "t1", "t2"]
    assert all(e.deliveries == 2 for e in again)
    restarted.ack(*ids[:3])
    assert restarted.read(count=10) == []


def test_ack_removes_from_pending(r: redis.Redis, stream: str) -> None:
    ids = _emit_n(r, stream, 3)
    consumer = EventConsumer(r, "g", "c", stream=stream)
    consumer.ensure_group()
    consumer.read()
    assert set(_pending(r, stream, "g")) == set(ids)
    assert consumer.ack(ids[0]) == 1
    assert set(_pending(r, stream, "g")) == set(ids[1:])
    assert consumer.ack(ids[0]) == 0
    assert consumer.ack() == 0
    consumer.ack(*ids[1:])
    assert _pending(r, stream, "g") == {}


def test_claim_stale_moves_a_dead_consumers_entries(r: redis.Redis, stream: str) -> None:
    ids = _emit_n(r, stream, 4)
    dead = EventConsumer(r, "g", "dead", stream=stream)
    dead.ensure_group()
    assert len(dead.read(count=3)) == 3
    live = EventConsumer(r, "g", "live", stream=stream)
    assert live.claim_stale(min_idle_ms=60_000) == []  # not idle long enough yet
    time.sleep(0.1)
    claimed = live.claim_stale(min_idle_ms=50)
    assert [e.id for e in claimed] == ids[:3]
    assert all(e.deliveries == 2 for e in claimed)
    assert {owner for owner, _ in _pending(r, stream, "g").values()} == {"live"}
    live.ack(*(e.id for e in claimed))
    assert [e.id for e in live.read()] == ids[3:]


def test_claim_stale_pages_through_more_than_one_batch(r: redis.Redis, stream: str) -> None:
    ids = _emit_n(r, stream, 25)
    dead = EventConsumer(r, "g", "dead", stream=stream)
    dead.ensure_group()
    dead.read(count=25)
    time.sleep(0.02)
    live = EventConsumer(r, "g", "live", stream=stream)
    assert [e.id for e in live.claim_stale(min_idle_ms=10, count=10)] == ids[:10]
    assert [e.id for e in live.claim_stale(min_idle_ms=0, count=100)] == ids  # its own too


def test_over_delivered_entry_goes_to_dead_letter_stream(r: redis.Redis, stream: str) -> None:
    [poison, ok] = [
        emit_event(r, MEMORY_SUMMARIZATION_FAILED, thread_id="t", attempt=2, stream=stream, k="v"),
        emit_event(r, MEMORY_SUMMARIZED, thread_id="t", stream=stream),
    ]
    consumer = EventConsumer(r, "g", "c", stream=stream, max_deliveries=3, retry_after_ms=0)
    consumer.ensure_group()
    deliveries = []
    for _ in range(3):  # delivered 3 times, never acked (the handler keeps crashing)
        restarted = EventConsumer(r, "g", "c", stream=stream, max_deliveries=3, retry_after_ms=0)
        [event] = restarted.read(count=1)
        assert event.id == poison
        deliveries.append(event.deliveries)
    assert deliveries == [1, 2, 3]
    # The 4th delivery exceeds max_deliveries: dead-lettered and acked, the next entry comes.
    assert ok
    assert [e.id for e in consumer.read(count=1)] == [ok]
    consumer.ack(ok)
    assert _pending(r, stream, "g") == {}
    assert consumer.read() == []
    assert consumer.claim_stale(min_idle_ms=0) == []
    [(_, dead)] = _raw(r, f"{stream}:dead")
    assert dead["original_id"] == poison
    assert dead["original_stream"] == stream
    assert dead["deliveries"] == "4"
    assert (dead["group"], dead["consumer"]) == ("g", "c")
    assert (dead["event"], dead["attempt"], dead["k"]) == (MEMORY_SUMMARIZATION_FAILED, "2", "v")
    assert r.xlen(stream) == 2  # copied, not removed from the stream


def test_claimed_entries_are_dead_lettered_too(r: redis.Redis, stream: str) -> None:
    [eid] = _emit_n(r, stream, 1)
    dead = EventConsumer(r, "g", "dead", stream=stream)
    dead.ensure_group()
    dead.read()
    live = EventConsumer(r, "g", "live", stream=stream, max_deliveries=1)
    assert live.claim_stale(min_idle_ms=0) == []
    assert _pending(r, stream, "g") == {}
    [(_, fields)] = _raw(r, f"{stream}:dead")
    assert (fields["original_id"], fields["deliveries"]) == (eid, "2")


def test_pending_entry_trimmed_from_stream_is_acked(r: redis.Redis, stream: str) -> None:
    _emit_n(r, stream, 3)
    consumer = EventConsumer(r, "g", "c", stream=stream)
    consumer.ensure_group()
    assert len(consumer.read()) == 3
    r.xtrim(stream, maxlen=0, approximate=False)
    assert EventConsumer(r, "g", "c", stream=stream, retry_after_ms=0).read() == []
    assert _pending(r, stream, "g") == {}


def test_consumer_with_decoded_responses(stream: str) -> None:
    url = get_settings().redis_url
    client = redis.Redis.from_url(url, decode_responses=True, protocol=3)
    try:
        eid = emit_event(client, MEMORY_SUMMARIZED, thread_id="t", stream=stream)
        consumer = EventConsumer(client, "g", "c", stream=stream)
        consumer.ensure_group()
        [event] = consumer.read()
        assert (event.id, event.thread_id, event.deliveries) == (eid, "t", 1)
        [again] = EventConsumer(client, "g", "c", stream=stream, retry_after_ms=0).read()
        assert again.deliveries == 2
    finally:
        client.close()


def test_tail_without_group_reads_from_the_end_or_the_start(r: redis.Redis, stream: str) -> None:
    ids = _emit_n(r, stream, 5)
    assert [e.id for e in tail_events(r, stream=stream, count=3)] == ids[2:]
    assert [e.id for e in tail_events(r, stream=stream, count=2, from_start=True)] == ids
    follow = tail_events(r, stream=stream, count=2, follow=True, block_ms=100)
    assert [e.id for e in islice(follow, 2)] == ids[3:]
    later = emit_event(r, MEMORY_SUMMARIZED, stream=stream)
    assert next(follow).id == later
    follow.close()
    assert r.xinfo_groups(stream) == []  # a plain reader creates nothing


def test_tail_on_empty_stream_follows_new_entries(r: redis.Redis, stream: str) -> None:
    assert list(tail_events(r, stream=stream)) == []
    follow = tail_events(r, stream=stream, follow=True, block_ms=100)
    eid = emit_event(r, MEMORY_SUMMARIZED, stream=stream)
    assert next(follow).id == eid
    follow.close()


def test_tail_with_group_consumes_and_acks(r: redis.Redis, stream: str) -> None:
    ids = _emit_n(r, stream, 3)
    got = list(tail_events(r, stream=stream, group="cli", consumer="me", count=10))
    assert [e.id for e in got] == ids
    assert _pending(r, stream, "cli") == {}
    assert list(tail_events(r, stream=stream, group="cli", consumer="me")) == []
    follow = tail_events(r, stream=stream, group="cli", consumer="me", follow=True, block_ms=100)
    eid = emit_event(r, MEMORY_SUMMARIZED, stream=stream)
    assert next(follow).id == eid
    follow.close()  # closed before asking for more: not acked, delivered again
    assert set(_pending(r, stream, "cli")) == {eid}


def test_format_event_is_one_line() -> None:
    event = Event.from_entry(
        b"1700000000000-0",
        {
            b"event": b"memory_summarization_failed",
            b"thread_id": b"t1",
            b"session_id": b"",
            b"attempt": b"2",
            b"error": "boom\nline two\t\u00e9".encode(),
            b"retry_in_s": b"120",
            b"at": b"2026-11-29T12:00:00.000Z",
            b"model": b"gpt",
        },
        deliveries=3,
    )
    line = format_event(event)
    assert "\n" not in line and "\t" not in line
    assert line == (
        "2026-11-29T12:00:00.000+00:00 1700000000000-0 memory_summarization_failed thread=t1 "
        "attempt=2 retry_in=120s deliveries=3 model=gpt error=boom\\nline two\\t\u00e9"
    )


def test_event_parsing_tolerates_malformed_fields() -> None:
    event = Event.from_entry("1700000000000-5", {"attempt": "x", "retry_in_s": "soon"})
    assert (event.event, event.attempt, event.retry_in_s) == ("", 0, None)
    assert event.at == datetime.fromtimestamp(1_700_000_000, UTC)  # from the entry id
    assert event.fields == {"attempt": "x", "retry_in_s": "soon"}


# Any text Redis can store: unicode of every plane, control characters, NUL, separators.
_TEXT = st.text(
    st.one_of(st.characters(codec="utf-8"), st.sampled_from("\x00\r\n\t\x1b\x7f\u2028\ufeff")),
    max_size=MAX_ERROR_CHARS,
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def test_text_round_trips_unchanged(r: redis.Redis, stream: str) -> None:
    consumer = EventConsumer(r, "g", "c", stream=stream)
    consumer.ensure_group()

    @hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(error=_TEXT, thread_id=_TEXT, note=_TEXT)
    def check(error: str, thread_id: str, note: str) -> None:
        eid = emit_event(r, MEMORY_SUMMARIZATION_FAILED, error=error, thread_id=thread_id,
                         stream=stream, note=note)  # fmt: skip
        [event] = consumer.read(count=1)
        consumer.ack(event.id)
        assert (event.id, event.error, event.thread_id) == (eid, error, thread_id)
        assert event.fields["note"] == note

    check()


def test_lone_surrogates_become_replacement_characters(r: redis.Redis, stream: str) -> None:
    @hsettings(max_examples=50, deadline=None)
    @given(text=st.tuples(st.text(), st.characters(categories=["Cs"]), st.text()).map("".join))
    def check(text: str) -> None:
        emit_event(r, MEMORY_SUMMARIZED, error=text, session_id=text, stream=stream)
        [event] = list(tail_events(r, stream=stream, count=1))
        assert event.error == event.session_id == _SURROGATE.sub("\ufffd", text)

    check()


# ---------------------------------------------------------------- the consumer contract


def test_a_failing_handler_is_retried_after_a_wait_not_burnt_at_once(
    r: redis.Redis, stream: str
) -> None:
    [eid] = _emit_n(r, stream, 1)
    consumer = EventConsumer(r, "g", "c", stream=stream, max_deliveries=3, retry_after_ms=400)
    consumer.ensure_group()
    assert [(e.id, e.deliveries) for e in consumer.read()] == [(eid, 1)]
    # The handler failed (no ack). Reading in a tight loop does not burn its deliveries...
    started = time.monotonic()
    while time.monotonic() - started < 0.3:
        assert consumer.read() == []
    assert _pending(r, stream, "g") == {eid: ("c", 1)}
    assert r.xlen(f"{stream}:dead") == 0
    # ...it comes back once it has waited, and then waits twice as long.
    time.sleep(0.15)
    assert [(e.id, e.deliveries) for e in consumer.read()] == [(eid, 2)]
    time.sleep(0.5)
    assert consumer.read() == []
    assert (consumer.wait_ms(1), consumer.wait_ms(2), consumer.wait_ms(30)) == (400, 800, 600_000)


def test_new_entries_flow_while_a_failed_one_waits(r: redis.Redis, stream: str) -> None:
    [first] = _emit_n(r, stream, 1)
    consumer = EventConsumer(r, "g", "c", stream=stream, retry_after_ms=60_000)
    consumer.ensure_group()
    assert [e.id for e in consumer.read()] == [first]  # not acked
    later = _emit_n(r, stream, 2)
    assert [e.id for e in consumer.read()] == later


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    from memory_core.settings import reset_settings_cache

    monkeypatch.setenv("MEMORY_EVENTS_MAXLEN", "100")
    reset_settings_cache()
    yield 100
    monkeypatch.undo()
    reset_settings_cache()


def test_lag_that_puts_unread_entries_at_risk_is_reported(
    r: redis.Redis, stream: str, small_cap: int, caplog: pytest.LogCaptureFixture
) -> None:
    from memory_core.metrics import EVENTS_CONSUMER_LAG

    consumer = EventConsumer(r, "g", "c", stream=stream)
    consumer.ensure_group()
    _emit_n(r, stream, 30)
    assert consumer.check_lag() == 30
    assert not [rec for rec in caplog.records if "events_lag_at_risk" in rec.getMessage()]
    _emit_n(r, stream, 40)
    with caplog.at_level(logging.WARNING, logger="memory_core.events"):
        assert consumer.check_lag() == 70
    assert any("memory.events_lag_at_risk" in rec.getMessage() for rec in caplog.records)
    assert EVENTS_CONSUMER_LAG.labels(stream, "g")._value.get() == 70


def test_entries_trimmed_before_a_group_read_them_are_reported(
    r: redis.Redis, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    from memory_core.metrics import EVENTS_LOST

    consumer = EventConsumer(r, "g", "c", stream=stream)
    consumer.ensure_group()
    _emit_n(r, stream, 1)
    consumer.ack(*(e.id for e in consumer.read()))
    _emit_n(r, stream, 10)
    r.xtrim(stream, maxlen=3, approximate=False)  # 7 entries gone unread
    before = EVENTS_LOST.labels(stream, "g")._value.get()
    with caplog.at_level(logging.WARNING, logger="memory_core.events"):
        consumer.check_lag()
    assert any("memory.events_lost" in rec.getMessage() for rec in caplog.records)
    assert EVENTS_LOST.labels(stream, "g")._value.get() == before + 1


def test_routine_events_never_trim_failures_away(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch, small_cap: int
) -> None:
    from memory_core.events import routine_stream
    from memory_core.settings import reset_settings_cache

    main = f"test:events:{uuid4().hex}"
    monkeypatch.setenv("MEMORY_EVENTS_STREAM", main)
    reset_settings_cache()
    try:
        failure = emit_event(r, MEMORY_SUMMARIZATION_FAILED, thread_id="t", attempt=1)
        for i in range(1000):  # a busy day of successful folds
            emit_event(r, MEMORY_SUMMARIZED, thread_id=f"t{i}")
        assert [e for e, _ in _raw(r, main)] == [failure]
        assert 100 <= r.xlen(routine_stream(main)) < 1000
    finally:
        r.delete(main, routine_stream(main))
