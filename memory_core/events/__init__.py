"""Memory events: stream.py writes and parses them, consumer.py reads them through a group."""

from memory_core.events.consumer import MAX_RETRY_WAIT_MS, EventConsumer, tail_events
from memory_core.events.stream import (
    EVENT_FIELDS,
    MAX_ERROR_CHARS,
    MEMORY_FINALIZE_REJECTED,
    MEMORY_JOB_DEAD_LETTERED,
    MEMORY_JOB_REFUSED,
    MEMORY_OWNER_FORGOTTEN,
    MEMORY_RETENTION_RUN,
    MEMORY_SUMMARIZATION_FAILED,
    MEMORY_SUMMARIZED,
    MEMORY_THREAD_DELETED,
    ROUTINE_EVENTS,
    Event,
    emit_event,
    emit_thread_events,
    format_event,
    routine_stream,
)

__all__ = [
    "EVENT_FIELDS",
    "MAX_ERROR_CHARS",
    "MAX_RETRY_WAIT_MS",
    "MEMORY_FINALIZE_REJECTED",
    "MEMORY_JOB_DEAD_LETTERED",
    "MEMORY_JOB_REFUSED",
    "MEMORY_OWNER_FORGOTTEN",
    "MEMORY_RETENTION_RUN",
    "MEMORY_SUMMARIZATION_FAILED",
    "MEMORY_SUMMARIZED",
    "MEMORY_THREAD_DELETED",
    "ROUTINE_EVENTS",
    "Event",
    "EventConsumer",
    "emit_event",
    "emit_thread_events",
    "format_event",
    "routine_stream",
    "tail_events",
]
