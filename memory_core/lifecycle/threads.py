"""Thread lifecycle: archive, delete, forget an owner, retention — and nothing comes back.

Every deletion goes through `memory_core.lifecycle.purge.purge_batch` (rows, turns, Redis copy,
LangGraph checkpoints and tombstone in one transaction). The tombstone makes late arrivals
harmless: a finalize for a deleted thread is `rejected` (reason `deleted`), a fold in flight
or waiting for its retry finds no row and writes nothing, and no copy can be written again.
Owner ids never reach events or logs; thread ids do (they name nothing).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import InterfaceError, OperationalError

from memory_core.conversation_memory import (
    RedisConversationMemory,
    ThreadNotFound,
    _as_uuid,
    _check_owner,
)
from memory_core.events import MEMORY_OWNER_FORGOTTEN, MEMORY_RETENTION_RUN, emit_event
from memory_core.io.db import describe_db_error, retry_on_disconnect
from memory_core.lifecycle.checkpoints import checkpoint_runs, delete_owner_checkpoints
from memory_core.lifecycle.purge import THREADS, TURNS, DeleteFailed, PurgeReport, purge_batch
from memory_core.lifecycle.trace_sweep import purge_now
from memory_core.logs import get_logger
from memory_core.metrics import RETENTION_RUNS
from memory_core.models import ConversationThread
from memory_core.write.snapshot import can_own

log = get_logger(__name__)

__all__ = [
    "DeleteFailed",
    "ForgetReport",
    "PurgeReport",
    "RetentionReport",
    "ThreadInfo",
    "apply_retention",
    "archive_thread",
    "delete_thread",
    "forget_owner",
    "list_threads",
    "unarchive_thread",
]


@dataclass(frozen=True)
class ThreadInfo:
    """One entry of a user's history list."""

    id: uuid.UUID
    title: str
    agent_type: str
    turns: int
    is_archived: bool
    archived_at: datetime | None
    created_at: datetime
    updated_at: datetime


def _memory(memory: RedisConversationMemory | None) -> RedisConversationMemory:
    return memory or RedisConversationMemory()


def list_threads(
    owner_id: str,
    *,
    include_archived: bool = False,
    limit: int = 20,
    before: tuple[datetime, uuid.UUID] | None = None,
    memory: RedisConversationMemory | None = None,
) -> list[ThreadInfo]:
    """The owner's threads, most recently active first (archived ones only when asked)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
        raise ValueError("limit must be an integer from 1 to 10000")
    if not can_own(owner_id):  # owns nothing (the driver would refuse it)
        return []
    with _memory(memory).session_factory() as session:
        rows = ConversationThread.history(
            session, owner_id, limit=limit, before=before, include_archived=include_archived
        )
        return [
            ThreadInfo(
                t.id,
                t.title,
                t.agent_type,
                t.last_seq,
                t.is_archived,
                t.archived_at,
                t.created_at,
                t.updated_at,
            )
            for t in rows
        ]


def archive_thread(
    thread_id: uuid.UUID | str, owner_id: str, *, memory: RedisConversationMemory | None = None
) -> None:
    """Hide the thread from the history list (still readable and continuable)."""
    _set_archived(thread_id, owner_id, True, memory)


def unarchive_thread(
    thread_id: uuid.UUID | str, owner_id: str, *, memory: RedisConversationMemory | None = None
) -> None:
    _set_archived(thread_id, owner_id, False, memory)


def _set_archived(thread_id: uuid.UUID | str, owner_id: str, archived: bool, memory: Any) -> None:
    tid = _as_uuid(thread_id)
    _check_owner(tid, owner_id)
    # Archiving is not activity: updated_at (history order, retention) stays as it is.
    stmt = (
        update(THREADS)
        .where(THREADS.c.id == tid, THREADS.c.owner_id == owner_id)
        .values(is_archived=archived, archived_at=func.now() if archived else None)
    )

    def run() -> int:
        with _memory(memory).engine.begin() as conn:
            return conn.execute(stmt).rowcount

    if not retry_on_disconnect(run):
        raise ThreadNotFound(tid)


def delete_thread(
    thread_id: uuid.UUID | str, owner_id: str, *, memory: RedisConversationMemory | None = None
) -> PurgeReport:
    """Delete one thread of `owner_id` for good (see memory_core/lifecycle/purge.py).

    `ThreadNotFound` for an unknown id, someone else's thread and an already deleted one alike;
    `DeleteFailed` (nothing deleted) when Redis or Postgres cannot be reached.
    """
    tid = _as_uuid(thread_id)
    _check_owner(tid, owner_id)
    mem = _memory(memory)
    choose = (
        select(THREADS.c.id)
        .where(THREADS.c.id == tid, THREADS.c.owner_id == owner_id)
        .with_for_update()
    )
    report, ids = purge_batch(mem, choose, reason="delete", purge_traces=purge_now(mem))
    if not ids:
        raise ThreadNotFound(tid)
    return report


@dataclass
class ForgetReport(PurgeReport):
    """A forget-owner run: what it removed, and what was left of the owner afterwards."""

    remaining_threads: int = 0
    remaining_checkpoints: int = 0


@contextmanager
def _postgres_failures() -> Iterator[None]:
    """Postgres unreachable mid-run: `DeleteFailed`, as for `delete_thread` (each committed
    batch stays deleted; running again finishes)."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise DeleteFailed(
            f"the run did not complete: Postgres failed ({describe_db_error(exc)}). Run it "
            "again: what was deleted stays deleted, the rest is deleted then."
        ) from None


def forget_owner(
    owner_id: str,
    *,
    memory: RedisConversationMemory | None = None,
    batch_size: int | None = None,
    progress: Callable[[PurgeReport, int], None] | None = None,
) -> ForgetReport:
    """Delete every thread of `owner_id`, `batch_size` per transaction, then the checkpoints
    of runs that never reached a thread row (paused before their first finalize).

    Idempotent and resumable: a run killed midway lost at most its current batch's work (rolled
    back); running it again deletes what is left. `progress(report, total)` before the
    first batch and after each.
    """
    if not can_own(owner_id):
        raise ValueError("owner_id must be a non-empty string of text")
    with _postgres_failures():
        return _forget_owner(owner_id, _memory(memory), batch_size, progress)


def _forget_owner(
    owner_id: str,
    mem: RedisConversationMemory,
    batch_size: int | None,
    progress: Callable[[PurgeReport, int], None] | None,
) -> ForgetReport:
    size = batch_size or mem.settings.memory_purge_batch_size
    total = _count(mem, THREADS.c.owner_id == owner_id)
    report = ForgetReport()
    if progress is not None:
        progress(report, total)  # before the first batch: the total is known
    purge = purge_now(mem)
    while True:
        choose = (
            select(THREADS.c.id)
            .where(THREADS.c.owner_id == owner_id)
            .order_by(THREADS.c.id)
            .limit(size)
            .with_for_update()
        )
        batch, ids = purge_batch(mem, choose, reason="forget", purge_traces=purge)
        if not ids:
            break
        report.add(batch)
        if progress is not None:
            progress(report, total)
    report.checkpoints += _forget_owner_runs(mem, owner_id, size)
    report.remaining_threads = _count(mem, THREADS.c.owner_id == owner_id)
    report.remaining_checkpoints = _owner_runs(mem, owner_id)
    emit_event(mem.redis, MEMORY_OWNER_FORGOTTEN, **_event_fields(report))
    log.info("memory.owner_forgotten", **report.as_dict())
    return report


def _forget_owner_runs(mem: RedisConversationMemory, owner_id: str, size: int) -> int:
    removed = 0
    while True:
        with mem.engine.begin() as conn:
            n = delete_owner_checkpoints(conn, owner_id, limit=size)
        removed += n
        if n < size:
            return removed


def _owner_runs(mem: RedisConversationMemory, owner_id: str) -> int:
    with mem.engine.connect() as conn:
        return checkpoint_runs(conn, owner_id=owner_id)


def _count(mem: RedisConversationMemory, where: Any) -> int:
    with mem.engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(THREADS).where(where)) or 0)


def _event_fields(report: PurgeReport, **extra: object) -> Any:  # str values (emit_event extras)
    return {k: str(v) for k, v in {**report.as_dict(), **extra}.items()}


def _delete_old(mem: RedisConversationMemory, old: Any, size: int) -> PurgeReport:
    report = PurgeReport()
    purge = purge_now(mem)
    while True:
        # SKIP LOCKED: a thread taking a turn right now is not old; the WHERE is checked again
        # on the row version we lock, so one that just got a turn is left alone.
        choose = (
            select(THREADS.c.id)
            .where(old)
            .order_by(THREADS.c.updated_at, THREADS.c.id)
            .limit(size)
            .with_for_update(skip_locked=True)
        )
        batch, ids = purge_batch(mem, choose, reason="retention", purge_traces=purge)
        if not ids:
            return report
        report.add(batch)


@dataclass
class RetentionReport:
    """One retention run: the cutoff, and what was (or, dry run, would be) deleted."""

    enabled: bool
    dry_run: bool = False
    days: float | None = None
    cutoff: datetime | None = None
    deleted: PurgeReport = field(default_factory=PurgeReport)


def apply_retention(
    *,
    memory: RedisConversationMemory | None = None,
    now: datetime | None = None,
    days: float | None = None,
    dry_run: bool = False,
    batch_size: int | None = None,
) -> RetentionReport:
    """Delete threads with no new turn for more than MEMORY_RETENTION_DAYS (`days` overrides),
    archived or not, in batches. `now` is the clock (tests pass their own). A dry run counts.
    """
    mem = _memory(memory)
    days = mem.settings.memory_retention_days if days is None else days
    if days is None:
        RETENTION_RUNS.labels("disabled").inc()
        return RetentionReport(enabled=False, dry_run=dry_run)
    if not 0 < days <= 36_500:  # also refuses NaN: a zero or negative window deletes all
        raise ValueError("retention days must be a number of days in (0, 36500]")
    if now is not None and now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    cutoff = (now or datetime.now(UTC)) - timedelta(days=days)
    old = THREADS.c.updated_at < cutoff
    result = RetentionReport(enabled=True, dry_run=dry_run, days=days, cutoff=cutoff)
    with _postgres_failures():
        if dry_run:
            result.deleted.threads = _count(mem, old)
            with mem.engine.connect() as conn:
                turns = select(func.count()).select_from(TURNS.join(THREADS)).where(old)
                result.deleted.turns = int(conn.scalar(turns) or 0)
        else:
            size = batch_size or mem.settings.memory_purge_batch_size
            result.deleted = _delete_old(mem, old, size)
    RETENTION_RUNS.labels("dry_run" if dry_run else "done").inc()
    fields = _event_fields(result.deleted, dry_run=dry_run, cutoff=cutoff.isoformat())
    emit_event(mem.redis, MEMORY_RETENTION_RUN, **fields)
    log.info("memory.retention_run", **fields)
    return result
