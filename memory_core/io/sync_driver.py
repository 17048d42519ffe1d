"""The blocking driver: performs the memory's steps (steps.py) with psycopg2 and redis-py."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import NoScriptError

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
    from redis.client import PubSub
    from sqlalchemy import Connection, Engine

    from memory_core.io.redis_kinds import SyncRedis

T = TypeVar("T")


@dataclass
class SyncIO:
    engine: Engine
    redis: SyncRedis
    scripts: Mapping[str, Any]
    conn: Connection | None = None
    pubsub: PubSub | None = field(default=None, repr=False)

    def do(self, step: Any) -> Any:  # noqa: PLR0911 - one branch per kind of step
        if isinstance(step, Script):
            script = self.scripts[step.name]
            try:  # EVALSHA itself: redis-py's Script wrapper cost 5-11 µs a call
                return script.registered_client.evalsha(
                    script.sha, len(step.keys), *step.keys, *step.args
                )
            except NoScriptError:  # a restarted or flushed server: the wrapper loads it
                return script(keys=step.keys, args=step.args)
        if isinstance(step, Sql | Begin | Commit | Rollback):
            return self._postgres(step)
        if isinstance(step, Read):
            with self.engine.connect() as conn:
                return fetch_result(conn.execute(step.stmt, step.params), step.fetch)
        if isinstance(step, Write):
            return fetch_rows(execute_autocommit(self.engine, step.stmt, step.params), step.fetch)
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
            conn = required(self.conn, "Sql/Commit outside Begin")
            if isinstance(step, Commit):
                conn.commit()
                return self.release()
            return fetch_result(conn.execute(step.stmt, step.params), step.fetch)
        except BaseException:
            self.release()  # a failed statement ends the transaction: nothing stays checked out
            raise

    def _pubsub(self, step: Subscribe | NextMessage) -> bool:
        if isinstance(step, Subscribe):
            self.pubsub = self.redis.pubsub()
            self.pubsub.subscribe(step.channel)
            return self._next(self.pubsub, SUBSCRIBE_TIMEOUT_S, b"subscribe")
        return self._next(required(self.pubsub, "NextMessage before Subscribe"), step.timeout)

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
