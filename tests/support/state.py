"""What Postgres, the broker and the event streams hold, read the same way by every test."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import redis
from sqlalchemy import func, select, update

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.devservices.poll import wait_for
from memory_core.events import Event, EventConsumer
from memory_core.fold.publisher import FINALIZE_QUEUE, FINALIZE_TASK, FOLD_QUEUE, FOLD_TASK
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread, ThreadMessage

# ------------------------------------------------------------------ Postgres


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


def stored(tids: Iterable[uuid.UUID]) -> dict[uuid.UUID, list[tuple[int, str]]]:
    """(seq, session_id) of every stored turn, per thread, in seq order."""
    ids = list(tids)
    out: dict[uuid.UUID, list[tuple[int, str]]] = {t: [] for t in ids}
    with session_scope() as s:
        rows = s.execute(
            select(ThreadMessage.thread_id, ThreadMessage.seq, ThreadMessage.session_id)
            .where(ThreadMessage.thread_id.in_(ids))
            .order_by(ThreadMessage.thread_id, ThreadMessage.seq)
        ).all()
    for tid, seq, sid in rows:
        out[tid].append((seq, str(sid)))
    return out


def count_stored(tids: Iterable[uuid.UUID]) -> int:
    """How many turns the threads hold in all."""
    with session_scope() as s:
        return int(
            s.scalar(select(func.count()).where(ThreadMessage.thread_id.in_(list(tids)))) or 0
        )


def landed(session_ids: Iterable[str]) -> set[str]:
    """Those of `session_ids` stored as turns."""
    ids = [uuid.UUID(x) for x in session_ids]
    if not ids:
        return set()
    with session_scope() as s:
        return {
            str(x)
            for x in s.scalars(
                select(ThreadMessage.session_id).where(ThreadMessage.session_id.in_(ids))
            )
        }


def thread_row(tid: uuid.UUID) -> ConversationThread | None:
    with session_scope() as s:
        return s.scalars(select(ConversationThread).where(ConversationThread.id == tid)).first()


def thread_rows(tids: Iterable[uuid.UUID]) -> dict[uuid.UUID, ConversationThread]:
    with session_scope() as s:
        rows = s.scalars(select(ConversationThread).where(ConversationThread.id.in_(list(tids))))
        return {t.id: t for t in rows}


def freshen_other_fold_requests(keep: Iterable[uuid.UUID] = ()) -> None:
    """Make every fold request in the database but the threads in `keep` due now: earlier
    tests leave folds long due (some behind a killed fold's lease that lapses later), which a
    sweep would take as lost, publish and run beside the test's own."""
    t = ConversationThread
    with session_scope() as s:
        s.execute(
            update(t)
            .where(t.fold_due_at.is_not(None), t.id.not_in(list(keep)))
            .values(fold_due_at=func.now())
        )


def folds_caught_up(tids: Iterable[uuid.UUID], threshold: int = 20) -> bool:
    """No thread keeps more than `threshold` turns unfolded."""
    return all(t.last_seq - t.summary_through_seq <= threshold for t in thread_rows(tids).values())


def settle_folds(tids: Iterable[uuid.UUID], timeout_s: float, log: Callable[[], str]) -> None:
    """Wait until `folds_caught_up`, then a moment more: a fold refreshes its thread's copy
    just after the commit that check sees, and a copy compared with Postgres in between
    differs (by design: it serves the older summary with every later turn until then)."""
    tids = list(tids)
    wait_for(lambda: folds_caught_up(tids), timeout_s, "folds to catch up", log, 0.25)
    time.sleep(1.0)


def folds_behind(tids: Iterable[uuid.UUID], threshold: int = 20) -> str:
    """The fold state of the threads `folds_caught_up` waits for: what a timeout shows."""
    return "\n".join(
        f"{t.id}: last {t.last_seq}, through {t.summary_through_seq}, due {t.fold_due_at}, "
        f"lease until {t.fold_lease_until}, attempts {t.fold_attempts}, {t.last_fold_error}"
        for t in thread_rows(tids).values()
        if t.last_seq - t.summary_through_seq > threshold
    )


# ------------------------------------------------------------------ working copies


def stale_copies(
    tids: Iterable[uuid.UUID], memory: RedisConversationMemory | None = None
) -> list[uuid.UUID]:
    """Threads whose working copy (as read, without any further save) differs from what it
    is rebuilt to from Postgres. Owner "user-42", make_snapshot's."""
    memory = memory or RedisConversationMemory()
    stale = []
    for tid in tids:
        cached = memory.get_context(tid, "user-42")
        memory.invalidate(tid)
        if memory.get_context(tid, "user-42") != cached:
            stale.append(tid)
    return stale


# ------------------------------------------------------------------ the broker (kombu on Redis)


def _finalize_session_ids(messages: Iterable[Any]) -> set[str]:
    out: set[str] = set()
    for message in messages:
        try:
            if message["headers"].get("task") != FINALIZE_TASK:
                continue
            args = json.loads(base64.b64decode(message["body"]))[0]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
        if args and isinstance(args[0], dict) and isinstance(args[0].get("session_id"), str):
            out.add(args[0]["session_id"])
    return out


def held_finalize_jobs(client: redis.Redis) -> set[str]:
    """session_ids of the finalize jobs workers hold unacked (the Redis broker's `unacked`)."""
    return _finalize_session_ids(json.loads(raw)[0] for raw in client.hvals("unacked"))


def queued_finalize_jobs(client: redis.Redis) -> set[str]:
    """session_ids of the finalize jobs waiting in the `memory.finalize` queue."""
    return _finalize_session_ids(json.loads(raw) for raw in client.lrange(FINALIZE_QUEUE, 0, -1))


def queued_fold_threads(client: redis.Redis) -> list[str]:
    """The thread ids of the fold jobs waiting in the `memory.fold` queue, oldest first."""
    out = []
    for raw in reversed(client.lrange(FOLD_QUEUE, 0, -1)):  # kombu LPUSHes, BRPOPs
        message = json.loads(raw)
        if message["headers"].get("task") == FOLD_TASK:
            out.append(json.loads(base64.b64decode(message["body"]))[0][0])
    return out


# ------------------------------------------------------------------ event streams


def drain_events(r: redis.Redis, stream: str, group: str = "test") -> list[Event]:
    """Read and ack what `group` has not seen yet on `stream` (at most 100 entries)."""
    consumer = EventConsumer(r, group, "c1", stream=stream)
    consumer.ensure_group()
    got: list[Any] = consumer.read(count=100)
    consumer.ack(*(e.id for e in got))
    return got
