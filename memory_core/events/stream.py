"""Memory events on a Redis stream (`memory:events`): the producer, the parsed entry, one line.

Producer: `emit_event` appends one entry with these fields, in this order (docs/ARCHITECTURE.md):
`event`, `thread_id`, `session_id`, `attempt`, `error`, `retry_in_s` ("" when unknown) and `at`
(ISO-8601 UTC, e.g. "2026-11-29T12:00:00.123Z"), then any extra string fields. The stream is
capped with an approximate `MAXLEN ~` (cheap; Redis trims whole nodes, so the length may exceed
the cap by up to one node). Emitting never raises: a failure is logged and `None` is returned.

Text handling: `error` is cut to `MAX_ERROR_CHARS` characters (the last three become "...").
Lone surrogates (which UTF-8, and so Redis, cannot store) are replaced by U+FFFD in every field;
any other text, control characters included, round-trips unchanged.

Two streams: failure and lifecycle events (`memory_summarization_failed`,
`memory_finalize_rejected`, ...) go to `memory:events`; the routine `memory_summarized` (one
per successful fold) goes to `memory:events:routine`, capped on its own, so a busy day of folds
never trims a failure out of `memory:events` before its consumers read it.

The consumer-group reader is in consumer.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from memory_core.io.redis_kinds import SyncRedis
from memory_core.logs import get_logger
from memory_core.settings import get_settings

MEMORY_SUMMARIZATION_FAILED = "memory_summarization_failed"
MEMORY_SUMMARIZED = "memory_summarized"
MEMORY_FINALIZE_REJECTED = "memory_finalize_rejected"
MEMORY_JOB_DEAD_LETTERED = "memory_job_dead_lettered"
# A job refused before or by its task (unknown task name, a body that is no task message of
# ours, wrong arguments): acked, never run, never dead-lettered. Extras: `message_id`, `task`,
# `queue` (each "" unless it is one of ours or a UUID), `reason` (a fixed code).
MEMORY_JOB_REFUSED = "memory_job_refused"
# Lifecycle (memory_core/lifecycle/threads.py): ids and counts only, never an owner id.
MEMORY_THREAD_DELETED = "memory_thread_deleted"
MEMORY_OWNER_FORGOTTEN = "memory_owner_forgotten"
MEMORY_RETENTION_RUN = "memory_retention_run"
# Emitted on every successful fold: kept apart so it never trims failures away.
ROUTINE_EVENTS = frozenset({MEMORY_SUMMARIZED})

EVENT_FIELDS = ("event", "thread_id", "session_id", "attempt", "error", "retry_in_s", "at")
MAX_ERROR_CHARS = 2000

_SURROGATES = re.compile("[\ud800-\udfff]")
_log = get_logger(__name__)


def routine_stream(stream: str) -> str:
    """Where routine events of `stream` go (`memory:events` -> `memory:events:routine`)."""
    return f"{stream}:routine"


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _clean(value: object) -> str:
    """Text Redis can store: lone surrogates become U+FFFD."""
    return _SURROGATES.sub("\ufffd", value if isinstance(value, str) else str(value))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else str(value)


def _truncate_error(error: str) -> str:
    return error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 3] + "..."


def emit_event(
    redis: SyncRedis,
    event: str,
    *,
    thread_id: str = "",
    session_id: str = "",
    attempt: int = 0,
    error: str = "",
    retry_in_s: float | None = None,
    stream: str | None = None,
    maxlen: int | None = None,
    **extra: str,
) -> str | None:
    """XADD one event (MAXLEN ~ `maxlen`); returns the entry id, or None if Redis failed.

    Without `stream`: routine events (`ROUTINE_EVENTS`) go to the routine stream of
    `MEMORY_EVENTS_STREAM`, the others to `MEMORY_EVENTS_STREAM` itself.

    Never raises, so a failure path can always call it. How long it can take when Redis is down
    is set by the client: its socket timeouts and its `retry` policy (redis-py's default retries
    a refused connection 10 times, about 4 s); give failure-path clients a bounded policy.
    """
    try:
        fields = _fields(event, thread_id, session_id, attempt, error, retry_in_s, extra)
        stream, maxlen = _where(event, stream, maxlen)
        return _text(redis.xadd(stream, cast(Any, fields), maxlen=maxlen, approximate=True))
    except Exception as exc:
        _log.warning(
            "memory.event_emit_failed",
            event_name=event,
            error=type(exc).__name__,
        )
        return None


def emit_thread_events(redis: SyncRedis, event: str, thread_ids: list[str], **extra: str) -> int:
    """One `event` per thread id in one round trip (a deletion of many threads); returns how
    many were added. Never raises, like `emit_event`."""
    try:
        stream, maxlen = _where(event, None, None)
        pipe = redis.pipeline(transaction=False)
        for tid in thread_ids:
            fields = _fields(event, tid, "", 0, "", None, extra)
            pipe.xadd(stream, cast(Any, fields), maxlen=maxlen, approximate=True)
        return len(pipe.execute())
    except Exception as exc:
        _log.warning("memory.event_emit_failed", event_name=event, error=type(exc).__name__)
        return 0


def _fields(  # noqa: PLR0917 - emit_event's fields, in the stream's order
    event: str,
    thread_id: str,
    session_id: str,
    attempt: int,
    error: str,
    retry_in_s: float | None,
    extra: dict[str, str],
) -> dict[str, str]:
    fields = {
        "event": _clean(event),
        "thread_id": _clean(thread_id),
        "session_id": _clean(session_id),
        "attempt": str(int(attempt)),
        "error": _truncate_error(_clean(error)),
        "retry_in_s": "" if retry_in_s is None else str(retry_in_s),
        "at": _now_iso(),
    }  # extra fields never override these
    fields.update({_clean(k): _clean(v) for k, v in extra.items() if k not in fields})
    return fields


def _where(event: str, stream: str | None, maxlen: int | None) -> tuple[str, int]:
    settings = get_settings()
    if stream is None:
        stream = settings.memory_events_stream
        if event in ROUTINE_EVENTS:
            stream = routine_stream(stream)
    return stream, settings.memory_events_maxlen if maxlen is None else maxlen


def _parse_at(value: str, entry_id: str) -> datetime:
    try:
        at = datetime.fromisoformat(value)
        return at if at.tzinfo else at.replace(tzinfo=UTC)
    except ValueError:  # missing or malformed: the entry id holds the append time in ms
        millis = entry_id.split("-", 1)[0]
        return datetime.fromtimestamp(int(millis) / 1000 if millis.isdigit() else 0, UTC)


def _parse_number(value: str, kind: type[float] | type[int]) -> float | int | None:
    try:
        return kind(value) if value else None
    except ValueError:
        return None


@dataclass
class Event:
    """One stream entry, parsed. `fields` keeps every raw field (extras included)."""

    id: str
    event: str
    thread_id: str
    session_id: str
    attempt: int
    error: str
    retry_in_s: float | None
    at: datetime
    fields: dict[str, str] = field(default_factory=dict)
    deliveries: int = 0  # from the group's pending entry list; 0 when unknown

    @classmethod
    def from_entry(cls, entry_id: object, raw: Any, deliveries: int = 0) -> Event:
        eid = _text(entry_id)
        fields = {_text(k): _text(v) for k, v in (raw or {}).items()}
        return cls(
            id=eid,
            event=fields.get("event", ""),
            thread_id=fields.get("thread_id", ""),
            session_id=fields.get("session_id", ""),
            attempt=int(_parse_number(fields.get("attempt", ""), int) or 0),
            error=fields.get("error", ""),
            retry_in_s=_parse_number(fields.get("retry_in_s", ""), float),
            at=_parse_at(fields.get("at", ""), eid),
            fields=fields,
            deliveries=deliveries,
        )


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_event(e: Event) -> str:
    """One line for the CLI: time, id, event, then the non-empty fields; error last."""
    retry = "" if e.retry_in_s is None else f"{e.retry_in_s:g}s"
    shown = [
        ("thread", e.thread_id),
        ("session", e.session_id),
        ("attempt", str(e.attempt) if e.attempt else ""),
        ("retry_in", retry),
        ("deliveries", str(e.deliveries) if e.deliveries > 1 else ""),
        *((k, v) for k, v in e.fields.items() if k not in EVENT_FIELDS),
        ("error", e.error),
    ]
    parts = [e.at.isoformat(timespec="milliseconds"), e.id, e.event or "?"]
    parts.extend(f"{k}={v}" for k, v in shown if v)
    return _one_line(" ".join(parts))
