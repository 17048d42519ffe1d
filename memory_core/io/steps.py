"""The memory's I/O as data: the steps its logic yields.

The read, save and wait logic (memory_core/conversation_memory.py,
memory_core/write/session_handler.py, memory_core/copy/read_wait.py) is written once, as generators:
each I/O is a step the logic yields (run this statement, call this Redis script, ...); a driver
performs it and sends the result back, or throws the step's exception in at the `yield`, where the
logic's own `try`/`except` handles it exactly as it would a direct call. `run_sync` (sync_driver.py)
performs the steps with the blocking clients (psycopg2 via SQLAlchemy, redis-py), `run_async`
(async_driver.py) with the asyncio ones (SQLAlchemy's asyncio extension on psycopg 3,
redis.asyncio): same statements, same scripts, same outcomes and errors.

A driver owns at most one Postgres connection at a time (a transaction between `Begin` and
`Commit`/`Rollback`) and one pub/sub subscription, and releases both whatever happens — the
logic returning, raising, or (async) the task being cancelled.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from sqlalchemy.exc import DBAPIError

T = TypeVar("T")
Fetch = Literal["one", "one_or_none", "first", "all", "none"]


@dataclass(frozen=True, slots=True)
class Begin:
    """Check out a connection and open a transaction (the next `Sql` steps run in it)."""


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit the open transaction and return its connection to the pool."""


@dataclass(frozen=True, slots=True)
class Rollback:
    """Roll back the open transaction, if any, and return its connection (idempotent)."""


@dataclass(frozen=True, slots=True)
class Sql:
    """One statement in the open transaction; the result is fetched as `fetch` says."""

    stmt: Any
    params: Mapping[str, Any] | None = None
    fetch: Fetch = "all"


@dataclass(frozen=True, slots=True)
class Read:
    """One statement on a pooled connection of its own, outside any transaction."""

    stmt: Any
    params: Mapping[str, Any] | None = None
    fetch: Fetch = "all"


@dataclass(frozen=True, slots=True)
class Write:
    """One statement that commits on its own (autocommit): one round trip, no BEGIN/COMMIT.
    Only for a single statement that is atomic by itself (memory_core/write/claim.py)."""

    stmt: Any
    params: Mapping[str, Any] | None = None
    fetch: Fetch = "all"


@dataclass(frozen=True, slots=True)
class Script:
    """A registered Lua script of the working copy (`read`, `write`): its raw reply."""

    name: str
    keys: Sequence[str]
    args: Sequence[Any]


@dataclass(frozen=True, slots=True)
class Delete:
    """DEL keys (one round trip)."""

    keys: Sequence[str]


@dataclass(frozen=True, slots=True)
class Call:
    """A blocking function with no asyncio client (kombu's publish): the async driver runs it
    on the publish threads (`aio.run_blocking`), so the event loop never waits for the broker."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


# A subscription counts once Redis confirmed it: a write after that is never missed.
SUBSCRIBE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Subscribe to a pub/sub channel (for the rest of the run); returns once Redis confirmed
    it, so no message published after the step returned can be missed."""

    channel: str


@dataclass(frozen=True, slots=True)
class NextMessage:
    """Wait up to `timeout` seconds for a message on the subscription: True if one came."""

    timeout: float


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Step = (
    Begin
    | Commit
    | Rollback
    | Sql
    | Read
    | Write
    | Script
    | Delete
    | Call
    | Subscribe
    | NextMessage
)
Steps = Generator[Any, Any, T]

BEGIN, COMMIT, ROLLBACK = Begin(), Commit(), Rollback()


def transaction(body: Steps[T]) -> Steps[T]:
    """`body` in one transaction: committed when it returns, rolled back when it raises."""
    yield BEGIN
    try:
        value = yield from body
    except Exception:
        yield ROLLBACK
        raise
    yield COMMIT
    return value


def retry_on_disconnect(make: Callable[[], Steps[T]]) -> Steps[T]:
    """Run `make()`'s steps; if they failed only because a pooled connection had died (a
    Postgres restart), run them once more on a fresh connection."""
    try:
        return (yield from make())
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        return (yield from make())


def required(value: T | None, what: str) -> T:
    if value is None:
        raise RuntimeError(f"steps out of order: {what}")
    return value


def fetch_result(result: Any, fetch: Fetch) -> Any:
    if fetch == "all":
        return result.all()
    if fetch == "one":
        return result.one()
    if fetch == "one_or_none":
        return result.one_or_none()
    if fetch == "first":
        return result.first()
    return None


def fetch_rows(rows: list[Any], fetch: Fetch) -> Any:
    """`fetch_result` over a list of rows (fast_write.py)."""
    if fetch == "all":
        return rows
    if fetch == "first":
        return rows[0] if rows else None
    if fetch == "none":
        return None
    if len(rows) > 1 or (fetch == "one" and not rows):
        raise RuntimeError(f"expected {'one row' if fetch == 'one' else 'at most one row'}")
    return rows[0] if rows else None
