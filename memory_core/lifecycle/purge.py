"""Deleting threads for good, a batch per transaction: the one path every deletion takes.

`delete_thread`, `forget_owner` and retention (memory_core/lifecycle/threads.py) only choose *which*
threads; `purge_batch` removes them, all or nothing:

  1. lock the chosen thread rows (`FOR UPDATE`): a finalize of those threads waits, and a
     finalize that had already claimed its seq has committed its turn (deleted below too);
  2. delete their Redis working copies and leave the marker that refuses every later copy
     write (`WorkingCopy.forget`), under this process's key prefix and every other one on
     record in `memory_settings_seen` (a process still on an old prefix serves its own) — if
     Redis cannot be reached the batch is rolled back and nothing is deleted
     (`DeleteFailed`): a copy left behind would keep serving the turns;
  3. delete the turns, the thread rows and the LangGraph checkpoints of the threads' runs,
     insert the tombstones (id and time only) and, with Langfuse configured, the trace purge
     requests; COMMIT.

After the commit, one `memory_thread_deleted` event per thread (ids only). A crash anywhere
leaves either the whole batch or none of it; rerunning the same selection finishes the job.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import Select, Table, delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import InterfaceError, OperationalError

from memory_core.conversation_memory import (
    CACHE_ERRORS,
    RedisConversationMemory,
    describe_cache_error,
)
from memory_core.copy.settings_check import seen_key_prefixes
from memory_core.copy.working_copy import WorkingCopy
from memory_core.events import MEMORY_THREAD_DELETED, emit_thread_events
from memory_core.io.db import describe_db_error, retry_on_disconnect
from memory_core.lifecycle.checkpoints import delete_thread_checkpoints
from memory_core.logs import describe_error, get_logger
from memory_core.metrics import THREADS_DELETED
from memory_core.models import ConversationThread, PendingTracePurge, ThreadMessage, ThreadTombstone

log = get_logger(__name__)

THREADS = cast(Table, ConversationThread.__table__)
TURNS = cast(Table, ThreadMessage.__table__)
TOMBSTONES = cast(Table, ThreadTombstone.__table__)
TRACE_PURGES = cast(Table, PendingTracePurge.__table__)


class DeleteFailed(RuntimeError):
    """Nothing was deleted (a store could not be reached); the same call can be retried."""


@dataclass
class PurgeReport:
    """What a deletion removed. `traces` counts Langfuse traces deleted right away; with
    Langfuse configured, `traces_pending` threads still have a purge request (retried by
    `memory.purge_traces` until the settle window has passed)."""

    threads: int = 0
    turns: int = 0
    copies: int = 0
    checkpoints: int = 0
    batches: int = 0
    traces: int = 0
    traces_pending: int = 0

    def add(self, other: PurgeReport) -> None:
        for f in fields(other):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


Chooser = Callable[[int], Select[Any]]


def purge_batch(
    memory: RedisConversationMemory,
    choose: Select[Any],
    *,
    reason: str,
    purge_traces: Callable[[list[uuid.UUID]], tuple[int, int]] | None = None,
) -> tuple[PurgeReport, list[uuid.UUID]]:
    """Delete the threads `choose` selects (a `SELECT id ... FOR UPDATE`), in one transaction.

    Returns the report and the ids deleted (none: nothing matched). `purge_traces(ids)` runs
    after the commit and returns (traces deleted, threads still pending).
    """
    try:
        report, ids = retry_on_disconnect(lambda: _purge(memory, choose))
    except (OperationalError, InterfaceError) as exc:  # Postgres unreachable
        raise DeleteFailed(
            f"the delete did not complete: Postgres failed ({describe_db_error(exc)}). "
            "Try again: what was deleted stays deleted, the rest is deleted then."
        ) from None
    if not ids:
        return report, ids
    THREADS_DELETED.labels(reason).inc(len(ids))
    emit_thread_events(memory.redis, MEMORY_THREAD_DELETED, [str(t) for t in ids], reason=reason)
    if purge_traces is not None and memory.settings.langfuse_configured:
        report.traces, report.traces_pending = purge_traces(ids)
    log.info("memory.threads_deleted", reason=reason, **report.as_dict())
    return report, ids


def _purge(
    memory: RedisConversationMemory, choose: Select[Any]
) -> tuple[PurgeReport, list[uuid.UUID]]:
    with memory.engine.connect() as conn:
        txn = conn.begin()
        try:
            ids = list(conn.scalars(choose))
            if not ids:
                txn.rollback()
                return PurgeReport(), []
            others = _copies_under_other_prefixes(memory, conn)
            forgotten: list[WorkingCopy] = []
            try:
                copies = memory.forget_copies(ids)
                forgotten.append(memory.copy)
                for other in others:
                    copies += other.forget(ids)
                    forgotten.append(other)
            except CACHE_ERRORS as exc:
                _unforget(forgotten, ids)  # the prefixes done before Redis failed
                raise DeleteFailed(
                    f"nothing was deleted: Redis failed ({describe_cache_error(exc)}); "
                    "the working copies must go with the threads. Try again."
                ) from None
            try:
                report = _delete_rows(conn, ids, memory.settings.langfuse_configured)
            except BaseException:
                _unforget([memory.copy, *others], ids)
                raise
            report.copies = copies
        except BaseException:
            txn.rollback()
            raise
        txn.commit()
    return report, ids


def _delete_rows(conn: Connection, ids: list[uuid.UUID], request_trace_purge: bool) -> PurgeReport:
    turns = conn.execute(delete(TURNS).where(TURNS.c.thread_id.in_(ids))).rowcount
    threads = conn.execute(delete(THREADS).where(THREADS.c.id.in_(ids))).rowcount
    rows = [{"thread_id": tid} for tid in ids]
    conn.execute(insert(TOMBSTONES).values(rows).on_conflict_do_nothing())
    if request_trace_purge:
        conn.execute(insert(TRACE_PURGES).values(rows).on_conflict_do_nothing())
    checkpoints = delete_thread_checkpoints(conn, ids)
    return PurgeReport(threads=threads, turns=turns, checkpoints=checkpoints, batches=1)


def _copies_under_other_prefixes(
    memory: RedisConversationMemory, conn: Connection
) -> list[WorkingCopy]:
    """The same Redis seen through every other key prefix on record (memory_settings_seen):
    after a prefix change, processes still on the old one read and write their own copies."""
    prefixes = sorted(seen_key_prefixes(conn) - {memory.key_prefix})
    own = memory.copy
    return [WorkingCopy(own.client, key_prefix=p, ttl_ms=own.ttl_ms, cap=own.cap) for p in prefixes]


def _unforget(copies: list[WorkingCopy], ids: list[uuid.UUID]) -> None:
    """The rows stay (rolled back): lift the markers so their copies work again. Best effort:
    a marker left behind only makes those threads read from Postgres until it expires."""
    for copy in copies:
        try:
            copy.unforget(ids)
        except Exception as exc:
            log.warning("memory.unforget_failed", threads=len(ids), error=describe_error(exc))
            return


def sweep_late_checkpoints(memory: RedisConversationMemory, *, window_h: float = 24) -> int:
    """Checkpoints of deleted threads written after their delete: a LangGraph run executing at
    that moment keeps checkpointing until it ends (its finalize is then rejected). Deletes the
    runs of threads deleted in the last `window_h` hours (a run outlives its delete by seconds
    to minutes); returns how many runs it removed."""
    recent = select(TOMBSTONES.c.thread_id).where(
        TOMBSTONES.c.deleted_at > func.now() - timedelta(hours=window_h)
    )
    with memory.engine.begin() as conn:
        ids = list(conn.scalars(recent))
        return delete_thread_checkpoints(conn, ids) if ids else 0


def is_deleted(conn: Connection, thread_id: uuid.UUID) -> bool:
    """True when the thread has a tombstone."""
    stmt = select(func.count()).where(TOMBSTONES.c.thread_id == thread_id)
    return bool(conn.scalar(stmt))
