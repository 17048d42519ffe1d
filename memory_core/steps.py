"""The memory's I/O as data: the steps its logic yields, and the two drivers that perform them.

The read, save and wait logic (conversation_memory.py, session_handler.py, read_wait.py) is
written once, as generators: each I/O is a step the logic yields (run this statement, call
this Redis script, ...); the driver performs it and sends the result back, or throws the
step's exception in at the `yield`, where the logic's own `try`/`except` handles it exactly as
it would a direct call. `run_sync` performs the steps with the blocking clients (psycopg2 via
SQLAlchemy, redis-py), `run_async` with the asyncio ones (SQLAlchemy's asyncio extension on
psycopg 3, redis.asyncio): same statements, same scripts, same outcomes and errors.

A driver owns at most one Postgres connection at a time (a transaction between `Begin` and
`Commit`/`Rollback`) and one pub/sub subscription, and releases both whatever happens — the
logic returning, raising, or (async) the task being cancelled.

A cancelled asyncio caller first lets the logic put right what the cut step may have done
(memory_core/cancellation.py), and never loses its `CancelledError`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.util import greenlet_spawn

from memory_core.aio import run_blocking
from memory_core.cancellation import never_lose_cancellation, unwind
from memory_core.fast_write import execute_autocommit

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aredis
    from redis.asyncio.client import PubSub as AsyncPubSub
    from redis.client import PubSub
    from sqlalchemy import Connection, Engine
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

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
    Only for a single statement that is atomic by itself (memory_core/claim.py)."""

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


def _required(value: T | None, what: str) -> T:
    if value is None:
        raise RuntimeError(f"steps out of order: {what}")
    return value


def _fetch(result: Any, fetch: Fetch) -> Any:
    if fetch == "all":
        return result.all()
    if fetch == "one":
        return result.one()
    if fetch == "one_or_none":
        return result.one_or_none()
    if fetch == "first":
        return result.first()
    return None


def _fetch_rows(rows: list[Any], fetch: Fetch) -> Any:
    """`_fetch` over a list of rows (fast_write.py)."""
    if fetch == "all":
        return rows
    if fetch == "first":
        return rows[0] if rows else None
    if fetch == "none":
        return None
    if len(rows) > 1 or (fetch == "one" and not rows):
        raise RuntimeError(f"expected {'one row' if fetch == 'one' else 'at most one row'}")
    return rows[0] if rows else None


# -- the blocking driver ---------------------------------------------------------------------


@dataclass
class SyncIO:
    engine: Engine
    redis: redis.Redis
    scripts: Mapping[str, Any]
    conn: Connection | None = None
    pubsub: PubSub | None = field(default=None, repr=False)

    def do(self, step: Any) -> Any:  # noqa: PLR0911 - one branch per kind of step
        if isinstance(step, Script):
            return self.scripts[step.name](keys=step.keys, args=step.args)
        if isinstance(step, Sql | Begin | Commit | Rollback):
            return self._postgres(step)
        if isinstance(step, Read):
            with self.engine.connect() as conn:
                return _fetch(conn.execute(step.stmt, step.params), step.fetch)
        if isinstance(step, Write):
            return _fetch_rows(execute_autocommit(self.engine, step.stmt, step.params), step.fetch)
        if isinstance(step, Delete):
            return self.redis.delete(*step.keys)
        if isinstance(step, Call):
            return step.fn(*step.args)
        if isinstance(step, Subscribe | NextMessage):
            return self._pubsub(step)
        if isinstance(step, Sleep):
            return time.sleep(step.seconds)
        raise TypeError(f"not a step: {type(step).__name__}")

    def _postgres(self, step: Sql | Begin | Commit | Rollback) -> Any:
        if isinstance(step, Rollback):
            return self.release()
        try:
            if isinstance(step, Begin):
                self.conn = self.engine.connect()
                self.conn.begin()
                return None
            conn = _required(self.conn, "Sql/Commit outside Begin")
            if isinstance(step, Commit):
                conn.commit()
                return self.release()
            return _fetch(conn.execute(step.stmt, step.params), step.fetch)
        except BaseException:
            self.release()  # a failed statement ends the transaction: nothing stays checked out
            raise

    def _pubsub(self, step: Subscribe | NextMessage) -> bool:
        if isinstance(step, Subscribe):
            self.pubsub = self.redis.pubsub()
            self.pubsub.subscribe(step.channel)
            return self._next(self.pubsub, SUBSCRIBE_TIMEOUT_S, b"subscribe")
        return self._next(_required(self.pubsub, "NextMessage before Subscribe"), step.timeout)

    @staticmethod
    def _next(pubsub: PubSub, timeout: float, kind: bytes = b"message") -> bool:
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            message = pubsub.get_message(timeout=left)
            if message is not None and message["type"] in (kind, kind.decode()):
                return True
        if kind == b"subscribe":
            raise TimeoutError("no subscription confirmation")  # an OSError: a Redis failure
        return False

    def release(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with suppress(Exception):  # a broken connection is discarded by the pool
                conn.close()  # rolls back what was not committed

    def close(self) -> None:
        self.release()
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            with suppress(Exception):  # best effort: the subscription dies with its socket
                pubsub.close()


def run_sync(steps: Steps[T], io: SyncIO) -> T:
    """Perform `steps` with blocking I/O; returns what the logic returns, raises what it raises."""
    try:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(value) if error is None else steps.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = io.do(step)
            except Exception as exc:
                error = exc
    finally:
        steps.close()
        io.close()


# -- the asyncio driver ----------------------------------------------------------------------


@dataclass
class AsyncIO:
    engine: AsyncEngine
    redis: aredis.Redis
    scripts: Mapping[str, Any]
    waits: aredis.Redis  # subscriptions: a pool of their own, so waits never starve reads
    conn: AsyncConnection | None = None
    pubsub: AsyncPubSub | None = field(default=None, repr=False)

    async def do(self, step: Any) -> Any:  # noqa: PLR0911 - one branch per kind of step
        if isinstance(step, Script):
            return await self.scripts[step.name](keys=step.keys, args=step.args)
        if isinstance(step, Sql | Begin | Commit | Rollback):
            return await self._postgres(step)
        if isinstance(step, Read):
            async with self.engine.connect() as conn:
                return _fetch(await conn.execute(step.stmt, step.params), step.fetch)
        if isinstance(step, Write):
            # The blocking fast path on the async pool's adapted connection, in one greenlet
            # (as SQLAlchemy's asyncio layer runs its own), instead of a greenlet per call.
            rows = await greenlet_spawn(
                execute_autocommit, self.engine.sync_engine, step.stmt, step.params
            )
            return _fetch_rows(rows, step.fetch)
        if isinstance(step, Delete):
            return await self.redis.delete(*step.keys)
        if isinstance(step, Call):
            return await run_blocking(step.fn, *step.args)
        if isinstance(step, Subscribe | NextMessage):
            return await self._pubsub(step)
        if isinstance(step, Sleep):
            return await asyncio.sleep(step.seconds)
        raise TypeError(f"not a step: {type(step).__name__}")

    async def _postgres(self, step: Sql | Begin | Commit | Rollback) -> Any:
        if isinstance(step, Rollback):
            return await self.release()
        try:
            if isinstance(step, Begin):
                self.conn = await self.engine.connect()
                await self.conn.begin()
                return None
            aconn = _required(self.conn, "Sql/Commit outside Begin")
            if isinstance(step, Commit):
                await aconn.commit()
                return await self.release()
            return _fetch(await aconn.execute(step.stmt, step.params), step.fetch)
        except BaseException:
            await self.release()
            raise

    async def _pubsub(self, step: Subscribe | NextMessage) -> bool:
        if isinstance(step, Subscribe):
            self.pubsub = self.waits.pubsub()
            await self.pubsub.subscribe(step.channel)
            return await self._next(self.pubsub, SUBSCRIBE_TIMEOUT_S, b"subscribe")
        pubsub = _required(self.pubsub, "NextMessage before Subscribe")
        return await self._next(pubsub, step.timeout)

    @staticmethod
    async def _next(pubsub: AsyncPubSub, timeout: float, kind: bytes = b"message") -> bool:
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            message = await pubsub.get_message(timeout=left)
            if message is not None and message["type"] in (kind, kind.decode()):
                return True
        if kind == b"subscribe":
            raise TimeoutError("no subscription confirmation")
        return False

    async def release(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with suppress(Exception, asyncio.CancelledError):  # a second cancellation mid-close
                await conn.close()

    async def close(self) -> None:
        await self.release()
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            with suppress(Exception, asyncio.CancelledError):
                await pubsub.aclose()


async def run_async(steps: Steps[T], io: AsyncIO) -> T:
    """Perform `steps` with asyncio I/O: the same logic as `run_sync`, never blocking the loop."""
    return await never_lose_cancellation(_perform(steps, io))


async def _perform(steps: Steps[T], io: AsyncIO) -> T:
    handed_over = False  # to the task putting things right after a cancellation
    try:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(value) if error is None else steps.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = await io.do(step)
            except Exception as exc:
                error = exc
            except asyncio.CancelledError:
                handed_over = True
                await unwind(steps, io)
                raise
    finally:
        if not handed_over:
            steps.close()
            await io.close()
