"""The asyncio driver: performs the memory's steps (steps.py) with psycopg 3 and redis.asyncio.

A cancelled caller first lets the logic put right what the cut step may have done
(cancellation.py), and never loses its `CancelledError`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import NoScriptError
from sqlalchemy.util import greenlet_spawn

from memory_core.io.aio import run_blocking
from memory_core.io.cancellation import never_lose_cancellation, unwind
from memory_core.io.fast_write import execute_autocommit
from memory_core.io.steps import (
    SUBSCRIBE_TIMEOUT_S,
    Begin,
    Call,
    Commit,
    Delete,
    NextMessage,
    Read,
    Rollback,
    Script,
    Sleep,
    Sql,
    Steps,
    Subscribe,
    Write,
    fetch_result,
    fetch_rows,
    required,
)

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub as AsyncPubSub
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from memory_core.io.redis_kinds import AsyncRedis

T = TypeVar("T")


@dataclass
class AsyncIO:
    engine: AsyncEngine
    redis: AsyncRedis
    scripts: Mapping[str, Any]
    waits: AsyncRedis  # subscriptions: a pool of their own, so waits never starve reads
    conn: AsyncConnection | None = None
    pubsub: AsyncPubSub | None = field(default=None, repr=False)

    async def do(self, step: Any) -> Any:  # noqa: PLR0911 - one branch per kind of step
        if isinstance(step, Script):
            script = self.scripts[step.name]
            try:  # EVALSHA itself, as the blocking driver (sync_driver.py)
                return await script.registered_client.evalsha(
                    script.sha, len(step.keys), *step.keys, *step.args
                )
            except NoScriptError:
                return await script(keys=step.keys, args=step.args)
        if isinstance(step, Sql | Begin | Commit | Rollback):
            return await self._postgres(step)
        if isinstance(step, Read):
            async with self.engine.connect() as conn:
                return fetch_result(await conn.execute(step.stmt, step.params), step.fetch)
        if isinstance(step, Write):
            # The blocking fast path on the async pool's adapted connection, in one greenlet
            # (as SQLAlchemy's asyncio layer runs its own), instead of a greenlet per call.
            rows = await greenlet_spawn(
                execute_autocommit, self.engine.sync_engine, step.stmt, step.params
            )
            return fetch_rows(rows, step.fetch)
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
            aconn = required(self.conn, "Sql/Commit outside Begin")
            if isinstance(step, Commit):
                await aconn.commit()
                return await self.release()
            return fetch_result(await aconn.execute(step.stmt, step.params), step.fetch)
        except BaseException:
            await self.release()
            raise

    async def _pubsub(self, step: Subscribe | NextMessage) -> bool:
        if isinstance(step, Subscribe):
            self.pubsub = self.waits.pubsub()
            await self.pubsub.subscribe(step.channel)
            return await self._next(self.pubsub, SUBSCRIBE_TIMEOUT_S, b"subscribe")
        pubsub = required(self.pubsub, "NextMessage before Subscribe")
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
