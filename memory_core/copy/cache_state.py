"""What a memory knows outside Redis and Postgres: the errors that degrade a read to Postgres,
the copies this process failed to update, and the checks that answer `ThreadNotFound`.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from uuid import UUID

import redis

from memory_core.write.snapshot import can_own

# Anything Redis can answer with instead of data: unreachable, timeouts, out of memory under
# `noeviction`, READONLY after a failover, other error replies, a Redis Cluster none of whose
# nodes answers (redis-py's cluster errors are not RedisErrors). None of them may fail a read
# (served from Postgres) or a write whose turn is already committed.
CACHE_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)
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


def _check_owner(thread_id: UUID, owner_id: str) -> None:
    """An owner id no snapshot can carry (not text, blank, NUL, lone surrogates) owns no
    thread, also one stored before blank ids were refused.

    Answer as for an unknown thread: the database driver would raise its own error for it,
    and only when the copy is not cached, which told a stranger whether the thread exists.
    """
    if not can_own(owner_id):
        raise ThreadNotFound(thread_id)


def _as_uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        # A malformed id cannot name any thread: same answer as for an unknown one.
        raise ThreadNotFound(value) from None
