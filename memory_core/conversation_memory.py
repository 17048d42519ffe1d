"""RedisConversationMemory: the working copy in Redis, rehydrated from Postgres on a miss."""

from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict
from contextlib import AbstractContextManager, suppress
from typing import Any
from uuid import UUID

import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from memory_core.caches import BoundedCache
from memory_core.context import ConversationContext, Exchange
from memory_core.db import get_engine, retry_on_disconnect, session_scope
from memory_core.logs import describe_error, get_logger
from memory_core.metrics import CACHE_READS, REHYDRATIONS
from memory_core.models import ConversationThread
from memory_core.redis_client import get_redis
from memory_core.settings import Settings, get_settings
from memory_core.settings_check import announce
from memory_core.working_copy import NOT_OWNER, WorkingCopy, context_from_copy

log = get_logger(__name__)

# Anything Redis can answer with instead of data: unreachable, timeouts, out of memory under
# `noeviction`, READONLY after a failover, other error replies. None of them may fail a read
# (served from Postgres) or a write whose turn is already committed.
CACHE_ERRORS = (redis.RedisError, OSError)
REDIS_ERRORS = CACHE_ERRORS  # the older name


def describe_cache_error(exc: BaseException) -> str:
    """Redis's error class and first line (server replies and client errors quote no data)."""
    first = next(iter(str(exc).strip().splitlines()), "")
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


class _CopiesBehind:
    """Threads whose working copy this process failed to update (Redis unreachable).

    Such a copy may survive the outage (AOF, a network blip) while missing the turns written
    meanwhile, and a hit never consults Postgres: it would hide them until the thread's next
    save. So the copies are dropped as soon as this process reaches that Redis again, and the
    next read rebuilds them from Postgres. Process-wide (`save_session_to_thread_safe` builds
    a memory per call), per Redis server and key prefix, bounded (oldest forgotten first).
    """

    MAX = 100_000

    def __init__(self) -> None:
        self._ids: dict[str, OrderedDict[UUID, None]] = {}
        self._lock = threading.Lock()

    def add(self, copy_id: str, thread_id: UUID) -> None:
        with self._lock:
            ids = self._ids.setdefault(copy_id, OrderedDict())
            ids[thread_id] = None
            while len(ids) > self.MAX:
                ids.popitem(last=False)

    def contains(self, copy_id: str, thread_id: UUID) -> bool:
        ids = self._ids.get(copy_id)
        return bool(ids) and thread_id in ids  # type: ignore[operator]

    def pending(self, copy_id: str, limit: int = 500) -> list[UUID]:
        if not self._ids.get(copy_id):  # the common case: no lock, no allocation
            return []
        with self._lock:
            return list(itertools.islice(self._ids.get(copy_id) or (), limit))

    def done(self, copy_id: str, thread_ids: list[UUID]) -> None:
        with self._lock:
            ids = self._ids.get(copy_id)
            if ids is not None:
                for tid in thread_ids:
                    ids.pop(tid, None)


COPIES_BEHIND = _CopiesBehind()


class ThreadNotFound(LookupError):
    """The thread does not exist or belongs to someone else (deliberately indistinguishable)."""

    def __init__(self, thread_id: UUID | str) -> None:
        super().__init__(f"thread {thread_id} not found")


class RedisConversationMemory:
    """Per-thread memory: Redis working copy first, Postgres as the source of truth.

    Tuning defaults come from settings (MEMORY_TTL_HOURS, MEMORY_MAX_RECENT_MESSAGES,
    MEMORY_COMPRESSION_THRESHOLD, MEMORY_KEY_PREFIX, MEMORY_MAX_UNFOLDED_MESSAGES); constructor
    arguments override them.
    """

    def __init__(
        self,
        redis_client: redis.Redis | None = None,
        *,
        ttl_hours: float | None = None,
        max_recent_messages: int | None = None,
        compression_threshold: int | None = None,
        key_prefix: str | None = None,
        max_unfolded_messages: int | None = None,
        settings: Settings | None = None,
        engine: Engine | None = None,
        local_cache_size: int | None = None,
    ) -> None:
        s = settings or get_settings()
        self.settings = s
        self.ttl_hours = s.memory_ttl_hours if ttl_hours is None else ttl_hours
        self.max_recent_messages = max_recent_messages or s.memory_max_recent_messages
        self.compression_threshold = compression_threshold or s.memory_compression_threshold
        self.key_prefix = key_prefix or s.memory_key_prefix
        # While folds keep failing the copy holds at most this many unfolded turns.
        self.max_unfolded_messages = (
            max_unfolded_messages
            or s.memory_max_unfolded_messages
            or 2 * self.compression_threshold
        )
        if self.max_unfolded_messages < 2 * self.compression_threshold:
            raise ValueError("max_unfolded_messages must be at least 2 x compression_threshold")
        if self.max_recent_messages >= self.compression_threshold:
            raise ValueError("max_recent_messages must be below compression_threshold")
        if not 0 < self.ttl_hours <= 876_000:  # also refuses NaN; at most 100 years
            raise ValueError("ttl_hours must be a positive number of hours (at most 876000)")
        self.redis = redis_client if redis_client is not None else get_redis(s.redis_url)
        self.engine = engine if engine is not None else get_engine(s.database_url)
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
        where = self.redis.connection_pool.connection_kwargs
        self._copy_id = (
            f"{where.get('host', where.get('path'))}:{where.get('port')}/{where.get('db')}"
            f"/{self.key_prefix}"
        )

    # -- reads ---------------------------------------------------------------------------

    def get_context(self, thread_id: UUID | str, owner_id: str) -> ConversationContext:
        """The thread's summary + unfolded turns; `ThreadNotFound` for strangers and unknowns.

        A hit is one Redis round trip; the owner is checked inside Redis, so a stranger's read
        ships nothing of the copy. A miss (expired copy) reads Postgres and repopulates the
        copy. Whatever Redis answers with (unreachable, out of memory, read-only, a copy that
        does not parse), the context is served from Postgres instead.
        """
        tid = _as_uuid(thread_id)
        _check_owner(tid, owner_id)
        try:
            found = self._read_copy(tid, owner_id)
        except Exception as exc:
            return self._read_around_cache(tid, owner_id, exc)
        if found is NOT_OWNER:
            # The same owner-checked Postgres look-up as for an unknown thread, so a stranger
            # is refused no faster than for a thread that does not exist. Should the owner
            # find it after all, the copy was not theirs (a partial write): drop it.
            ctx = self._load(tid, owner_id)
            self._discard_copy(tid)
            return ctx
        CACHE_READS.labels("miss" if found is None else "hit").inc()
        return found if isinstance(found, ConversationContext) else self.rehydrate(tid, owner_id)

    def _read_copy(self, tid: UUID, owner_id: str) -> ConversationContext | str | None:
        try:
            self._drop_copies_behind()
        except CACHE_ERRORS:
            if COPIES_BEHIND.contains(self._copy_id, tid):
                raise  # this copy may miss turns and cannot be dropped: read around it
        known = self._parsed.get(tid)
        found = self.copy.read_if_changed(tid, owner_id, known[0] if known else None)
        if found is None or isinstance(found, str):
            if known is not None:  # the copy is gone (expired, or the thread deleted)
                self._parsed.pop(tid)
            return found
        version, meta, members = found
        if members is None and known is not None:
            return known[1]  # unchanged since this process parsed it
        ctx = context_from_copy(tid, meta, members or [])
        self._parsed.put(tid, (version, ctx), sum(map(len, members or ())))
        return ctx

    def _read_around_cache(self, tid: UUID, owner_id: str, exc: Exception) -> ConversationContext:
        """Serve from Postgres (uncached) when the copy cannot be read or trusted."""
        CACHE_READS.labels("unavailable").inc()
        if isinstance(exc, CACHE_ERRORS):
            log.warning(
                "memory.cache_unavailable",
                thread_id=str(tid),
                error=describe_cache_error(exc),
            )
        else:  # the copy did not parse: rebuild it on the next read
            log.error(
                "memory.cache_corrupt",
                thread_id=str(tid),
                error=describe_error(exc),
            )
            self._discard_copy(tid)
        return self._load(tid, owner_id)

    def rehydrate(self, thread_id: UUID | str, owner_id: str) -> ConversationContext:
        """Rebuild the working copy from Postgres (the stored summary + unfolded turns)."""
        tid = _as_uuid(thread_id)
        _check_owner(tid, owner_id)
        ctx, last_seq = self._load_with_last(tid, owner_id)
        self._store(owner_id, ctx, last_seq)
        REHYDRATIONS.inc()
        return ctx

    def _load(self, tid: UUID, owner_id: str) -> ConversationContext:
        return self._load_with_last(tid, owner_id)[0]

    def _load_with_last(self, tid: UUID, owner_id: str) -> tuple[ConversationContext, int]:
        def read() -> Any:
            with self.engine.connect() as conn:
                return ConversationThread.rehydrate(conn, tid, owner_id, self.max_unfolded_messages)

        found = retry_on_disconnect(read)
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
        with suppress(redis.RedisError, OSError):
            self._drop_copies_behind()

    def _drop_copies_behind(self) -> None:
        """Delete the copies this process failed to update (raises Redis errors)."""
        while behind := COPIES_BEHIND.pending(self._copy_id):
            self.redis.delete(*(key for tid in behind for key in self.copy.keys(tid)))
            COPIES_BEHIND.done(self._copy_id, behind)
            log.info("memory.cache_dropped_behind", threads=len(behind))

    def _discard_copy(self, tid: UUID) -> None:
        try:
            self.copy.delete(tid)
        except Exception as exc:
            self._write_failed(tid, exc)

    def session_factory(self) -> AbstractContextManager[Session]:
        """An ORM session on this memory's database, one transaction (commit or rollback)."""
        return session_scope(engine=self.engine)

    # -- writes (called by the finalize core and the fold worker) ------------------------

    def record_turn(self, owner_id: str, thread_id: UUID, through: int, turn: Exchange) -> str:
        """Add a committed turn to the copy, rebuilding from Postgres if the copy is behind.

        Returns the outcome for logs/metrics: ok, rebuilt, or unavailable. Never raises: the
        turn is already durable in Postgres, and whatever failed here (Redis refusing the
        write, Postgres failing the rebuild) leaves the copy marked to be dropped, so no read
        serves it without the turn.
        """
        try:
            self._drop_copies_behind()
            if turn.seq == 1:
                first = ConversationContext(thread_id=thread_id, recent=[turn])
                status = self.copy.merge(owner_id, first, last_seq=1)
            else:
                status = self.copy.append(thread_id, owner_id, through, turn)
            if status in ("missing", "gap", "stale"):
                log.info(
                    "memory.cache_rebuild",
                    thread_id=str(thread_id),
                    reason=status,
                )
                ctx, last_seq = self._load_with_last(thread_id, owner_id)
                self.copy.merge(owner_id, ctx, last_seq)
                REHYDRATIONS.inc()
                return "rebuilt"
            return status
        except Exception as exc:
            self._write_failed(thread_id, exc)
            return "unavailable"

    def refresh_summary(self, owner_id: str, thread_id: UUID, summary: str, through: int) -> str:
        """Carry a fold's summary into the copy, if there is one; never raises."""
        try:
            self._drop_copies_behind()
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


def _check_owner(thread_id: UUID, owner_id: str) -> None:
    """An owner id no snapshot can carry (not text, NUL, lone surrogates) owns no thread.

    Answer as for an unknown thread: the database driver would raise its own error for it,
    and only when the copy is not cached, which told a stranger whether the thread exists.
    """
    if not isinstance(owner_id, str) or "\x00" in owner_id:
        raise ThreadNotFound(thread_id)
    try:
        owner_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ThreadNotFound(thread_id) from None


def _as_uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        # A malformed id cannot name any thread: same answer as for an unknown one.
        raise ThreadNotFound(value) from None
