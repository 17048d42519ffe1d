"""RedisConversationMemory: the working copy in Redis, rehydrated from Postgres on a miss.

Every read and copy write is written once, as steps (memory_core/io/steps.py): `get_context`
performs them with the blocking clients, `aget_context` with the asyncio ones.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, suppress
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from memory_core.caches import BoundedCache
from memory_core.copy.cache_state import (
    CACHE_ERRORS,
    COPIES_BEHIND,
    REDIS_ERRORS,
    ThreadNotFound,
    _as_uuid,
    _check_owner,
    describe_cache_error,
)
from memory_core.copy.context import ConversationContext, Exchange
from memory_core.copy.read_wait import OnTimeout, WaitFor, context_including, session_to_wait_for
from memory_core.copy.settings_check import announce
from memory_core.copy.working_copy import NOT_OWNER, WorkingCopy, context_from_copy
from memory_core.io.async_driver import run_async
from memory_core.io.db import session_scope
from memory_core.io.memory_clients import MemoryClients
from memory_core.io.redis_kinds import AsyncRedis, SyncRedis, redis_location
from memory_core.io.steps import (
    Read,
    Steps,
    retry_on_disconnect,
)
from memory_core.io.sync_driver import run_sync
from memory_core.logs import describe_error, get_logger
from memory_core.metrics import CACHE_READS, REHYDRATIONS
from memory_core.models import ConversationThread
from memory_core.settings import Settings, get_settings

__all__ = [
    "CACHE_ERRORS",
    "REDIS_ERRORS",
    "RedisConversationMemory",
    "ThreadNotFound",
    "describe_cache_error",
]

log = get_logger(__name__)


class RedisConversationMemory(MemoryClients):
    """Per-thread memory: Redis working copy first, Postgres as the source of truth.

    Tuning defaults come from settings (MEMORY_TTL_HOURS, MEMORY_MAX_RECENT_MESSAGES,
    MEMORY_COMPRESSION_THRESHOLD, MEMORY_FOLD_TOKEN_TRIGGER, MEMORY_KEY_PREFIX,
    MEMORY_MAX_UNFOLDED_MESSAGES); constructor arguments override them. The asyncio clients
    (`async_redis`, `async_engine`) default to the running loop's pooled ones for the blocking
    clients' servers (memory_core/io/memory_clients.py).
    """

    def __init__(
        self,
        redis_client: SyncRedis | None = None,
        *,
        ttl_hours: float | None = None,
        max_recent_messages: int | None = None,
        compression_threshold: int | None = None,
        fold_token_trigger: int | None = None,
        key_prefix: str | None = None,
        max_unfolded_messages: int | None = None,
        settings: Settings | None = None,
        engine: Engine | None = None,
        local_cache_size: int | None = None,
        async_redis: AsyncRedis | None = None,
        async_engine: AsyncEngine | None = None,
    ) -> None:
        s = settings or get_settings()
        self.settings = s
        self.ttl_hours = s.memory_ttl_hours if ttl_hours is None else ttl_hours
        self.max_recent_messages = max_recent_messages or s.memory_max_recent_messages
        self.compression_threshold = compression_threshold or s.memory_compression_threshold
        # Estimated tokens of unfolded turns that also make a fold due (0: off).
        self.fold_token_trigger = (
            s.memory_fold_token_trigger if fold_token_trigger is None else fold_token_trigger
        )
        self.key_prefix = key_prefix or s.memory_key_prefix
        # While folds keep failing the copy holds at most this many unfolded turns.
        self.max_unfolded_messages = (
            max_unfolded_messages
            or s.memory_max_unfolded_messages
            or 2 * self.compression_threshold
        )
        self._check_limits()
        self._init_clients(s, redis_client, engine, async_redis, async_engine)
        # Parsed contexts by copy version: a hit on an unchanged copy skips re-validation.
        # Bounded in entries and in bytes (of the copies' stored JSON).
        self._parsed: BoundedCache[UUID, tuple[bytes, ConversationContext]] = BoundedCache(
            s.memory_local_cache_size if local_cache_size is None else local_cache_size,
            s.memory_local_cache_max_bytes,
        )
        self.copy = WorkingCopy(
            self.redis,
            key_prefix=self.key_prefix,
            ttl_ms=int(self.ttl_hours * 3_600_000),
            cap=self.max_unfolded_messages,
        )
        announce(self)  # once an hour per process and settings, off the caller's path
        self._copy_id = f"{redis_location(self.redis)}/{self.key_prefix}"

    def _check_limits(self) -> None:
        """Refuse a fold arithmetic or copy lifetime that cannot work (ValueError)."""
        if self.max_unfolded_messages < 2 * self.compression_threshold:
            raise ValueError("max_unfolded_messages must be at least 2 x compression_threshold")
        if self.max_recent_messages >= self.compression_threshold:
            raise ValueError("max_recent_messages must be below compression_threshold")
        if self.fold_token_trigger < 0:
            raise ValueError("fold_token_trigger must be 0 (off) or a positive number of tokens")
        if not 0 < self.ttl_hours <= 876_000:  # also refuses NaN; at most 100 years
            raise ValueError("ttl_hours must be a positive number of hours (at most 876000)")

    def _sync_scripts(self) -> dict[str, Any]:
        return self.copy.scripts

    # -- reads ---------------------------------------------------------------------------

    def get_context(
        self,
        thread_id: UUID | str,
        owner_id: str,
        *,
        wait_for: WaitFor = None,
        wait_s: float | None = None,
        on_timeout: Literal["raise", "flag"] = "raise",
    ) -> ConversationContext:
        """The thread's summary + unfolded turns; `ThreadNotFound` for strangers and unknowns.

        A hit is one Redis round trip; the owner is checked inside Redis, so a stranger's read
        ships nothing of the copy. A miss (expired copy) reads Postgres and repopulates the
        copy. Whatever Redis answers with (unreachable, out of memory, read-only, a copy that
        does not parse), the context is served from Postgres instead.

        `wait_for` (an enqueued turn's `SaveOutcome`, or its session id): include that turn,
        waiting up to `wait_s` (MEMORY_READ_WAIT_S) for a worker to save it; then
        `on_timeout` says what happens (copy/read_wait.py: `TurnNotReady`, or a flagged context).
        """
        return run_sync(
            self._steps(thread_id, owner_id, wait_for, wait_s, on_timeout), self.sync_io()
        )

    async def aget_context(
        self,
        thread_id: UUID | str,
        owner_id: str,
        *,
        wait_for: WaitFor = None,
        wait_s: float | None = None,
        on_timeout: Literal["raise", "flag"] = "raise",
    ) -> ConversationContext:
        """`get_context` on asyncio clients: the same steps, the same answers and errors."""
        steps = self._steps(thread_id, owner_id, wait_for, wait_s, on_timeout)
        return await run_async(steps, self.async_io())

    def _steps(
        self,
        thread_id: UUID | str,
        owner_id: str,
        wait_for: WaitFor,
        wait_s: float | None,
        on_timeout: OnTimeout,
    ) -> Steps[ConversationContext]:
        tid = _as_uuid(thread_id)
        _check_owner(tid, owner_id)
        session_id = session_to_wait_for(wait_for)
        if session_id is None:
            return self.context_steps(tid, owner_id)
        if on_timeout not in ("raise", "flag"):
            raise ValueError("on_timeout must be 'raise' or 'flag'")
        wait = self.settings.memory_read_wait_s if wait_s is None else wait_s
        if not 0 <= wait <= 300:  # also refuses NaN
            raise ValueError("wait_s must be between 0 and 300 seconds")
        return context_including(
            self, tid, owner_id, session_id=session_id, wait_s=wait, on_timeout=on_timeout
        )

    def context_steps(self, tid: UUID, owner_id: str) -> Steps[ConversationContext]:
        try:
            found = yield from self._read_copy(tid, owner_id)
        except Exception as exc:
            return (yield from self._read_around_cache(tid, owner_id, exc))
        if found is NOT_OWNER:
            # The same owner-checked Postgres look-up as for an unknown thread, so a stranger
            # is refused no faster than for a thread that does not exist. Should the owner
            # find it after all, the copy was not theirs (a partial write): drop it.
            ctx = yield from self.load_steps(tid, owner_id)
            yield from self._discard_copy(tid)
            return ctx
        CACHE_READS.labels("miss" if found is None else "hit").inc()
        if isinstance(found, ConversationContext):
            return found
        return (yield from self._rehydrate(tid, owner_id))

    def _read_copy(self, tid: UUID, owner_id: str) -> Steps[ConversationContext | str | None]:
        yield from self._drop_copies_behind_for(tid)
        known = self._parsed.get(tid)
        reply = yield self.copy.read_step(tid, owner_id, known[0] if known else None)
        found = self.copy.parse_read(reply, known[0] if known else None)
        if found is None or isinstance(found, str):
            if known is not None:  # the copy is gone (expired, or the thread deleted)
                self._parsed.pop(tid)
            return found
        if found.body is None and known is not None:
            return known[1]  # unchanged since this process parsed it
        ctx = context_from_copy(tid, found)
        self._parsed.put(tid, (found.version, ctx), len(found.body or b""))
        return ctx

    def _read_around_cache(
        self, tid: UUID, owner_id: str, exc: Exception
    ) -> Steps[ConversationContext]:
        """Serve from Postgres (uncached) when the copy cannot be read or trusted."""
        CACHE_READS.labels("unavailable").inc()
        if isinstance(exc, CACHE_ERRORS):
            log.warning(
                "memory.cache_unavailable", thread_id=str(tid), error=describe_cache_error(exc)
            )
        else:  # the copy did not parse: rebuild it on the next read
            log.error("memory.cache_corrupt", thread_id=str(tid), error=describe_error(exc))
            yield from self._discard_copy(tid)
        return (yield from self.load_steps(tid, owner_id))

    def rehydrate(self, thread_id: UUID | str, owner_id: str) -> ConversationContext:
        """Rebuild the working copy from Postgres (the stored summary + unfolded turns)."""
        tid = _as_uuid(thread_id)
        _check_owner(tid, owner_id)
        return run_sync(self._rehydrate(tid, owner_id), self.sync_io())

    def _rehydrate(self, tid: UUID, owner_id: str) -> Steps[ConversationContext]:
        ctx, last_seq = yield from self.load_with_last_steps(tid, owner_id)
        try:
            yield self.copy.merge_step(owner_id, ctx, last_seq)
        except Exception as exc:
            self._write_failed(ctx.thread_id, exc)
        REHYDRATIONS.inc()
        return ctx

    def load_steps(self, tid: UUID, owner_id: str) -> Steps[ConversationContext]:
        return (yield from self.load_with_last_steps(tid, owner_id))[0]

    def _load_with_last(self, tid: UUID, owner_id: str) -> tuple[ConversationContext, int]:
        return run_sync(self.load_with_last_steps(tid, owner_id), self.sync_io())

    def load_with_last_steps(
        self, tid: UUID, owner_id: str
    ) -> Steps[tuple[ConversationContext, int]]:
        stmt = ConversationThread.rehydrate_statement(tid, owner_id, self.max_unfolded_messages)

        def read() -> Steps[Any]:
            return (yield Read(stmt))

        found = ConversationThread.rehydrated((yield from retry_on_disconnect(read)))
        if found is None:
            raise ThreadNotFound(tid)
        head, rows = found
        ctx = ConversationContext(
            thread_id=tid,
            summary=head.summary,
            summary_through_seq=head.summary_through_seq,
            recent=[Exchange.from_row(r) for r in rows],
        )
        return ctx, head.last_seq

    def _store(self, owner_id: str, ctx: ConversationContext, last_seq: int) -> None:
        """Merge a Postgres snapshot into the copy (blocking); a failure marks it behind."""
        try:
            self.copy.merge(owner_id, ctx, last_seq)
        except Exception as exc:
            self._write_failed(ctx.thread_id, exc)

    def _write_failed(self, thread_id: UUID, exc: BaseException) -> None:
        """A copy write failed (perhaps half-way): drop the copy once Redis lets us."""
        error = describe_cache_error(exc) if isinstance(exc, CACHE_ERRORS) else describe_error(exc)
        level = logging.WARNING if isinstance(exc, CACHE_ERRORS) else logging.ERROR
        log.log(level, "memory.cache_write_failed", thread_id=str(thread_id), error=error)
        self.mark_copy_behind(thread_id)

    def mark_copy_behind(self, thread_id: UUID) -> None:
        """A write to this thread's copy failed: drop the copy once Redis answers again."""
        COPIES_BEHIND.add(self._copy_id, thread_id)

    def drop_copies_behind(self) -> None:
        """Best effort: drop the copies this process failed to update (workers that only
        fold call this on every fold, so they too act on what they marked)."""
        with suppress(*CACHE_ERRORS):
            run_sync(self._drop_copies_behind(), self.sync_io())

    def _drop_copies_behind_for(self, tid: UUID) -> Steps[None]:
        """Drop the copies behind before using `tid`'s; raises Redis errors only when `tid`'s
        own copy is behind and could not be dropped. Another thread's copy on a node that is
        down (a Redis Cluster failing over) does not stop this one's read or write."""
        try:
            yield from self._drop_copies_behind()
        except CACHE_ERRORS:
            if COPIES_BEHIND.contains(self._copy_id, tid):
                raise  # this copy may miss turns and cannot be dropped: go around it

    def _drop_copies_behind(self) -> Steps[None]:
        """Delete the copies this process failed to update (raises Redis errors)."""
        while behind := COPIES_BEHIND.pending(self._copy_id):
            yield self.copy.delete_step_many(behind)
            COPIES_BEHIND.done(self._copy_id, behind)
            log.info("memory.cache_dropped_behind", threads=len(behind))

    def drop_copy_steps(self, thread_id: UUID) -> Steps[None]:
        """The copy may lack a committed turn (a save cut short): mark it behind at once, then
        drop it if Redis answers. Never raises; a copy still marked is dropped by this
        process's next call that reaches Redis."""
        self.mark_copy_behind(thread_id)
        self._parsed.pop(thread_id)
        try:
            yield self.copy.delete_step(thread_id)
        except CACHE_ERRORS as exc:
            log.warning(
                "memory.cache_write_failed",
                thread_id=str(thread_id),
                error=describe_cache_error(exc),
            )
            return
        COPIES_BEHIND.done(self._copy_id, [thread_id])

    def _discard_copy(self, tid: UUID) -> Steps[None]:
        try:
            yield self.copy.delete_step(tid)
        except Exception as exc:
            self._write_failed(tid, exc)

    def session_factory(self) -> AbstractContextManager[Session]:
        """An ORM session on this memory's database, one transaction (commit or rollback)."""
        return session_scope(engine=self.engine)

    # -- writes (called by the finalize core and the fold worker) ------------------------

    def record_turn(self, owner_id: str, thread_id: UUID, through: int, turn: Exchange) -> str:
        """Add a committed turn to the copy (see `record_turn_steps`); never raises."""
        return run_sync(self.record_turn_steps(owner_id, thread_id, through, turn), self.sync_io())

    def record_turn_steps(
        self, owner_id: str, thread_id: UUID, through: int, turn: Exchange
    ) -> Steps[str]:
        """Add a committed turn to the copy, rebuilding from Postgres if the copy is behind.

        Returns the outcome for logs/metrics: ok, rebuilt, or unavailable. Never raises: the
        turn is already durable in Postgres, and whatever failed here (Redis refusing the
        write, Postgres failing the rebuild) leaves the copy marked to be dropped, so no read
        serves it without the turn.
        """
        try:
            yield from self._drop_copies_behind_for(thread_id)
            if turn.seq == 1:
                first = ConversationContext(thread_id=thread_id, recent=[turn])
                status = self.copy.status((yield self.copy.merge_step(owner_id, first, 1)))
            else:
                status = self.copy.status(
                    (yield self.copy.append_step(thread_id, owner_id, through, turn))
                )
            if status in ("missing", "gap", "stale"):
                log.info("memory.cache_rebuild", thread_id=str(thread_id), reason=status)
                ctx, last_seq = yield from self.load_with_last_steps(thread_id, owner_id)
                yield self.copy.merge_step(owner_id, ctx, last_seq)
                REHYDRATIONS.inc()
                return "rebuilt"
            return status
        except Exception as exc:
            self._write_failed(thread_id, exc)
            return "unavailable"
        except GeneratorExit:  # closed mid-write (its driver interrupted): the copy may lack it
            self.mark_copy_behind(thread_id)
            raise

    def refresh_summary(self, owner_id: str, thread_id: UUID, summary: str, through: int) -> str:
        """Carry a fold's summary into the copy, if there is one; never raises."""
        try:
            run_sync(self._drop_copies_behind_for(thread_id), self.sync_io())
            return self.copy.refresh(owner_id, thread_id, summary, through)
        except Exception as exc:
            self._write_failed(thread_id, exc)
            return "unavailable"

    def invalidate(self, thread_id: UUID | str) -> None:
        """Drop the working copy (the next read rehydrates from Postgres)."""
        tid = _as_uuid(thread_id)
        self._parsed.pop(tid)
        self.copy.delete(tid)

    def forget_copies(self, thread_ids: list[UUID]) -> int:
        """Deleted threads: drop their copies (here and in Redis) and refuse later writes to
        them (`WorkingCopy.forget`). Raises Redis errors: a delete must not go on without it."""
        for tid in thread_ids:
            self._parsed.pop(tid)
        return self.copy.forget(thread_ids) if thread_ids else 0
