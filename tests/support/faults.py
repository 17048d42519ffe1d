"""Fault injection at the boundaries, with real servers and no mocks.

* `FaultyRedis`: a private `redis-server` (AOF on, `noeviction`) that a test can stop and
  start, fill (`maxmemory` below what it holds: every write answers OOM) or demote (`REPLICAOF`
  a port where nothing listens: every write answers READONLY).
* `RowLock`: another Postgres session holding a thread's row lock; with `lock_timeout` set on
  the engine under test, its writes to that thread fail as they would behind a long
  transaction or a blocked migration.
* `terminate_backends`: `pg_terminate_backend` on the sessions of one `application_name`, as
  a failover or an idle-connection reaper would.
"""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url

from memory_core.devservices.ports import free_port
from tests.support.services import PrivateRedis


class FaultyRedis(PrivateRedis):
    """A private Redis whose faults are switched on and off by the test."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.admin = redis.Redis.from_url(self.url, socket_timeout=5)
        self.state = "up"

    def down(self) -> None:
        self.stop(signal.SIGTERM)  # AOF flushed: the copies survive the restart
        self.state = "down"

    def up(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.admin.connection_pool.disconnect()
        self.admin.config_set("maxmemory", 0)
        self.admin.replicaof("NO", "ONE")
        self.state = "up"

    def full(self) -> None:
        """Out of memory under `noeviction`: writes fail with OOM, reads and DEL still work."""
        self.admin.config_set("maxmemory", 1)
        self.state = "oom"

    def read_only(self) -> None:
        """A demoted primary (as after a failover): writes fail with READONLY."""
        self.admin.replicaof("127.0.0.1", free_port())
        self.state = "readonly"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.admin.close()
        super().close()


def engine_with_lock_timeout(database_url: str, app_name: str, lock_timeout_ms: int) -> Engine:
    """An engine whose sessions give up on a row lock after `lock_timeout_ms`."""
    return create_engine(
        database_url,
        pool_size=2,
        max_overflow=2,
        connect_args={
            "connect_timeout": 5,
            "application_name": app_name,
            "options": f"-c lock_timeout={lock_timeout_ms}",
        },
    )


class RowLock:
    """Holds `conversation_threads` row locks in a transaction of its own until released."""

    def __init__(self, database_url: str) -> None:
        self._engine = create_engine(database_url)
        self._conn: Connection | None = None
        self.held: set[uuid.UUID] = set()

    def hold(self, thread_id: uuid.UUID) -> bool:
        """Lock the thread's row; False when the thread does not exist (nothing to lock)."""
        if self._conn is None:
            self._conn = self._engine.connect()
            self._conn.begin()
        row = self._conn.execute(
            text("SELECT id FROM conversation_threads WHERE id = :id FOR UPDATE"),
            {"id": thread_id},
        ).first()
        if row is not None:
            self.held.add(thread_id)
        return row is not None

    def release(self) -> None:
        if self._conn is not None:
            self._conn.rollback()
            self._conn.close()
            self._conn = None
        self.held.clear()

    def close(self) -> None:
        self.release()
        self._engine.dispose()


def terminate_backends(database_url: str, app_name: str) -> int:
    """Kill every Postgres session of `app_name` on the URL's database (other test sessions,
    xdist's workers among them, have databases of their own); how many there were."""
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = :a AND pid <> pg_backend_pid()"
                        " AND datname = current_database()"
                    ),
                    {"a": app_name},
                ).all()
            )
    finally:
        admin.dispose()


@contextlib.contextmanager
def postgres_role(
    database_url: str, grants: list[str]
) -> Iterator[tuple[str, Callable[[str], None]]]:
    """A login role with only `grants` (e.g. "SELECT ON thread_messages"): a revoked grant.

    Yields its URL and a function granting more while the test runs. The role is dropped
    (its sessions terminated) afterwards; roles are cluster-wide, so the name is unique.
    """
    url = make_url(database_url)
    role = f"am_role_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")

    def grant(what: str) -> None:
        with admin.connect() as c:
            c.execute(text(f"GRANT {what} TO {role}"))

    with admin.connect() as c:
        c.execute(text(f"CREATE ROLE {role} LOGIN"))
    try:
        grant("USAGE ON SCHEMA public")
        for what in grants:
            grant(what)
        yield url.set(username=role).render_as_string(hide_password=False), grant
    finally:
        with admin.connect() as c:
            c.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
                {"r": role},
            )
            c.execute(text(f"DROP OWNED BY {role}"))
            c.execute(text(f"DROP ROLE {role}"))
        admin.dispose()
