"""What Postgres and the event streams hold, read the same way by every test."""

from __future__ import annotations

import uuid
from typing import Any

import redis
from sqlalchemy import select

from memory_core.db import session_scope
from memory_core.events import Event, EventConsumer
from memory_core.models import ConversationThread, ThreadMessage


def stored_seqs(tid: uuid.UUID) -> list[int]:
    """The seq of every stored turn of the thread, in order."""
    with session_scope() as s:
        return list(
            s.scalars(
                select(ThreadMessage.seq)
                .where(ThreadMessage.thread_id == tid)
                .order_by(ThreadMessage.seq)
            )
        )


def thread_row(tid: uuid.UUID) -> ConversationThread | None:
    with session_scope() as s:
        return s.scalars(select(ConversationThread).where(ConversationThread.id == tid)).first()


def drain_events(r: redis.Redis, stream: str, group: str = "test") -> list[Event]:
    """Read and ack what `group` has not seen yet on `stream` (at most 100 entries)."""
    consumer = EventConsumer(r, group, "c1", stream=stream)
    consumer.ensure_group()
    got: list[Any] = consumer.read(count=100)
    consumer.ack(*(e.id for e in got))
    return got
