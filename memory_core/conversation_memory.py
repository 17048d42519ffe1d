"""RedisConversationMemory: the working copy in Redis, rehydrated from Postgres on a miss."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar
from uuid import UUID

import redis
import structlog
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from memory_core.context import ConversationContext, Exchange
from memory_core.db import get_engine, retry_on_disconnect, session_scope
from memory_core.metrics import CACHE_READS, REHYDRATIONS
from memory_core.models import ConversationThread
from memory_core.redis_client import get_redis
from memory_core.settings import Settings, get_settings
from memory_core.working_copy import WorkingCopy, context_from_copy

log = structlog.get_logger(__name__)

# Errors that mean "the cache is unavailable", never "the data is wrong".
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError)


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
        self.redis = redis_client if redis_client is not None else get_redis(s.redis_url)
        self.engine = engine if engine is not None else get_engine(s.database_url)
        # Parsed contexts by copy version: a hit on an unchanged copy skips re-validation.
        self._parsed: _LRU[UUID, tuple[bytes, ConversationContext]] = _LRU(
            s.memory_local_cache_size if local_cache_size is None else local_cache_size
        )
        self.copy = WorkingCopy(
            self.redis,
            key_prefix=self.key_prefix,
            ttl_ms=int(self.ttl_hours * 3_600_000),
            cap=self.max_unfolded_messages,
        )
        where = self.redis.connection_pool.connection_kwargs
        self._copy_id = (
            f"{where.get('host', where.get('path'))}:{where.get('port')}/{where.get('db')}"
            f"/{self.key_prefix}"
        )

    # -- reads ---------------------------------------------------------------------------

    def get_context(self, thread_id: UUID | str, owner_id: str) -> ConversationContext:
        """The thread's summary + unfolded turns; `ThreadNotFound` for strangers and unknowns.

        A hit is one Redis round trip. A miss (expired copy) or an unreachable Redis reads
        Postgres; a miss also repopulates the copy.
        """
        tid = _as_uuid(thread_id)
        _check_owner(tid, owner_id)
        known = self._parsed.get(tid)
        try:
            self._drop_copies_behind()
            found = self.copy.read_if_changed(tid, known[0] if known else None)
        except REDIS_ERRORS as exc:
            log.warning("memory.cache_unavailable", thread_id=str(tid), error=str(exc))
            CACHE_READS.labels("unavailable").inc()
            return self._load(tid, owner_id)
        CACHE_READS.labels("miss" if found is None else "hit").inc()
        if found is not None:
            version, meta, members = found
            if meta.get(b"owner", b"").decode() != owner_id:
                # Refuse no faster than for an unknown thread (whose miss costs a Postgres
                # look-up): an instant refusal told a stranger the thread exists.
                self._load(tid, owner_id)  # finds nothing for this owner: ThreadNotFound
                raise ThreadNotFound(tid)
            if members is None and known is not None:
                return known[1]  # unchanged since this process parsed it
            ctx = context_from_copy(tid, meta, members or [])
            self._parsed.put(tid, (version, ctx))
            return ctx
        return self.rehydrate(tid, owner_id)

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
        except REDIS_ERRORS as exc:
            log.warning("memory.cache_write_failed", thread_id=str(ctx.thread_id), error=str(exc))
            self.mark_copy_behind(ctx.thread_id)

    def mark_copy_behind(self, thread_id: UUID) -> None:
        """A write to this thread's copy failed: drop the copy once Redis answers again."""
        COPIES_BEHIND.add(self._copy_id, thread_id)

    def _drop_copies_behind(self) -> None:
        """Delete the copies this process failed to update (raises Redis errors)."""
        while behind := COPIES_BEHIND.pending(self._copy_id):
            self.redis.delete(*(key for tid in behind for key in self.copy.keys(tid)))
            COPIES_BEHIND.done(self._copy_id, behind)
            log.info("memory.cache_dropped_behind", threads=len(behind))

    def session_factory(self) -> AbstractContextManager[Session]:
        """An ORM session on this memory's database, one transaction (commit or rollback)."""
        return session_scope(engine=self.engine)

    # -- writes (called by the finalize core and the fold worker) ------------------------

    def record_turn(self, owner_id: str, thread_id: UUID, through: int, turn: Exchange) -> str:
        """Add a committed turn to the copy, rebuilding from Postgres if the copy is behind.

        Returns the outcome for logs/metrics: ok, rebuilt, or unavailable. Never raises for
        Redis trouble: the turn is already durable in Postgres.
        """
        try:
            self._drop_copies_behind()
            if turn.seq == 1:
                first = ConversationContext(thread_id=thread_id, recent=[turn])
                status = self.copy.merge(owner_id, first, last_seq=1)
            else:
                status = self.copy.append(thread_id, owner_id, through, turn)
            if status in ("missing", "gap", "stale"):
                log.info("memory.cache_rebuild", thread_id=str(thread_id), reason=status)
                self.rehydrate(thread_id, owner_id)
                return "rebuilt"
            return status
        except REDIS_ERRORS as exc:
            log.warning("memory.cache_write_failed", thread_id=str(thread_id), error=str(exc))
            self.mark_copy_behind(thread_id)
            return "unavailable"

    def invalidate(self, thread_id: UUID | str) -> None:
        """Drop the working copy (the next read rehydrates from Postgres)."""
        self.copy.delete(_as_uuid(thread_id))


K = TypeVar("K")
V = TypeVar("V")


class _LRU(Generic[K, V]):
    """A small thread-safe LRU map; size 0 disables it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


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
