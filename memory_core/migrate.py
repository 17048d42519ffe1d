"""Schema migrations: `agent-memory migrate` and the test suite both go through here.

A deployment runs migrations from several places at once: a Kubernetes Job, a compose
`migrate` service, an init container. Two upgrades of a fresh database at once fail
(`UniqueViolation` on `pg_type`: both create the same table), so every upgrade, downgrade and
checkpointer setup holds a Postgres advisory lock for its whole run (as pypi/warehouse does):
the second waits, then finds the schema at head and does nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, pool, text

# `migrations/` in a checkout, shipped in the wheel as `memory_core.migrations` (pyproject.toml).
MIGRATIONS_DIR = Path(str(files("memory_core.migrations")))


def alembic_config(database_url: str | None = None) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url:
        # ConfigParser interpolation treats % specially (URL-encoded passwords).
        cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


# Any fixed 64-bit key shared by every migrator of a database ("agent-memory migrate").
LOCK_KEY = 0x6167656E745F6D6D
LOCK_POLL_S = 0.2
_held = threading.local()


@contextlib.contextmanager
def migration_lock(database_url: str | None = None) -> Iterator[None]:
    """Hold the migrations' advisory lock (waiting for it) on a connection of its own; nested
    uses in one thread hold it once (a second session would wait for the first forever)."""
    if getattr(_held, "depth", 0):
        _held.depth += 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    from memory_core.settings import get_settings  # noqa: PLC0415 - migrations/env.py import order

    engine = create_engine(
        database_url or get_settings().database_url,
        poolclass=pool.NullPool,
        isolation_level="AUTOCOMMIT",
    )
    try:
        with engine.connect() as conn:
            # Try, never wait inside Postgres: a session blocked in pg_advisory_lock holds a
            # snapshot, and the holder's CREATE INDEX CONCURRENTLY (the checkpointer's
            # migrations) waits for every such snapshot: both would wait forever.
            while not conn.execute(
                text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}
            ).scalar():
                time.sleep(LOCK_POLL_S)
            _held.depth = 1
            try:
                yield
            finally:
                _held.depth = 0
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
    finally:
        engine.dispose()


def upgrade(database_url: str | None = None, revision: str = "head") -> None:
    with migration_lock(database_url):
        command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str | None = None, revision: str = "base") -> None:
    with migration_lock(database_url):
        command.downgrade(alembic_config(database_url), revision)
