"""Langfuse traces of deleted threads: purged at once, then again until nothing can come.

Folds are traced to Langfuse with the thread id as the session (memory_core/fold/summarizer.py),
and traces hold the conversation. Deleting a thread records a purge request (`trace_purges`:
thread id and time) in the deleting transaction, tries the purge right after the commit, and
`sweep_trace_purges` (the `memory.purge_traces` task, every few minutes under beat) repeats it
until a pass made `MEMORY_TRACE_PURGE_SETTLE_S` after the delete finds no trace left: a fold
that was mid-call when the thread was deleted may still be sending its trace, and Langfuse
ingests asynchronously. A request is never dropped while Langfuse fails.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, update

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.lifecycle.purge import TRACE_PURGES
from memory_core.logs import get_logger
from memory_core.metrics import TRACE_PURGES as TRACE_PURGE_OUTCOMES

log = get_logger(__name__)


@dataclass
class TraceSweep:
    checked: int = 0  # threads whose traces were purged in this pass
    deleted: int = 0  # traces deleted
    done: int = 0  # requests finished (settled, none left)
    pending: int = 0  # requests kept for a later pass
    error: str | None = None


def purge_now(
    memory: RedisConversationMemory,
) -> Callable[[list[uuid.UUID]], tuple[int, int]]:
    """What a deletion runs after its commit: purge those threads' traces now. After a failure
    it stops trying for the rest of the run (the sweeper retries); returns (deleted, pending)."""
    failed = False

    def purge(ids: list[uuid.UUID]) -> tuple[int, int]:
        nonlocal failed
        if failed:
            return 0, len(ids)
        # A first attempt on the caller's path: Langfuse's short (prompt) timeout; the sweeper
        # retries with LANGFUSE_API_TIMEOUT_S.
        quick = memory.settings.langfuse_prompt_timeout_s
        sweep = _purge(memory, ids, datetime.now(UTC), timeout_s=quick)
        failed = sweep.error is not None
        return sweep.deleted, sweep.pending

    return purge


def sweep_trace_purges(
    *,
    memory: RedisConversationMemory | None = None,
    now: datetime | None = None,
    batch: int = 100,
) -> TraceSweep:
    """Retry every pending trace purge once (oldest first); stops at the first Langfuse error."""
    mem = memory or RedisConversationMemory()
    total = TraceSweep()
    if not mem.settings.langfuse_configured:
        return total
    after: tuple[datetime, uuid.UUID] | None = None
    while True:
        rows = _page(mem, after, batch)
        if not rows:
            return total
        after = rows[-1]
        sweep = _purge(mem, [r[1] for r in rows], now or datetime.now(UTC))
        for f in ("checked", "deleted", "done", "pending"):
            setattr(total, f, getattr(total, f) + getattr(sweep, f))
        if sweep.error is not None:
            total.error = sweep.error
            return total


def _page(
    mem: RedisConversationMemory, after: tuple[datetime, uuid.UUID] | None, batch: int
) -> list[tuple[datetime, uuid.UUID]]:
    t = TRACE_PURGES
    stmt = select(t.c.requested_at, t.c.thread_id).order_by(t.c.requested_at, t.c.thread_id)
    if after is not None:
        stmt = stmt.where(
            (t.c.requested_at > after[0])
            | ((t.c.requested_at == after[0]) & (t.c.thread_id > after[1]))
        )
    with mem.engine.connect() as conn:
        return [(r[0], r[1]) for r in conn.execute(stmt.limit(batch))]


def _purge(
    mem: RedisConversationMemory,
    ids: list[uuid.UUID],
    now: datetime,
    *,
    timeout_s: float | None = None,
) -> TraceSweep:
    """Purge these threads' traces; finish the requests that have settled, count the rest."""
    from memory_core.lifecycle.trace_purge import purge_session_traces  # noqa: PLC0415 - SDK only when used

    settings = mem.settings
    if timeout_s is not None:
        settings = settings.model_copy(update={"langfuse_api_timeout_s": timeout_s})
    result = purge_session_traces([str(i) for i in ids], settings=settings)
    t = TRACE_PURGES
    mine = t.c.thread_id.in_(ids)
    with mem.engine.begin() as conn:
        if result.error is not None or not result.done:
            conn.execute(
                update(t)
                .where(mine)
                .values(attempts=t.c.attempts + 1, last_error=result.error or "traces remain")
            )
            TRACE_PURGE_OUTCOMES.labels("failed").inc(len(ids))
            log.warning("memory.trace_purge_failed", threads=len(ids), error=result.error)
            return TraceSweep(len(ids), result.deleted, 0, len(ids), result.error or "remain")
        settled = now - timedelta(seconds=mem.settings.memory_trace_purge_settle_s)
        done = conn.execute(delete(t).where(mine, t.c.requested_at <= settled)).rowcount
        conn.execute(update(t).where(mine).values(attempts=t.c.attempts + 1, last_error=None))
    TRACE_PURGE_OUTCOMES.labels("done").inc(done)
    TRACE_PURGE_OUTCOMES.labels("pending").inc(len(ids) - done)
    return TraceSweep(len(ids), result.deleted, done, len(ids) - done)
