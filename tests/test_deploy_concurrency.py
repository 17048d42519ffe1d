"""What deployments do at once: migrations started together from several places (a Kubernetes
Job, a compose `migrate`, an init container) on a fresh database all succeed, and leave the
schema a single run leaves; workers started together on a fresh database and broker (each
declaring the queues) all come up and share the jobs, each landing once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, make_url, text

from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.migrate import upgrade
from memory_core.settings import get_settings
from tests.support import REPO
from tests.support.brokers import BROKERS
from tests.support.commands import run_module
from tests.support.snapshots import make_snapshot
from tests.support.workers import producer, send_finalize

SCHEMA = """
SELECT 'column', c.table_schema || '.' || c.table_name || '.' || c.column_name,
       c.data_type || ' ' || c.is_nullable || ' ' || coalesce(c.column_default, '')
  FROM information_schema.columns c
 WHERE c.table_schema NOT IN ('pg_catalog', 'information_schema')
UNION ALL
SELECT 'index', schemaname || '.' || indexname, indexdef FROM pg_indexes
 WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
UNION ALL
SELECT 'constraint', n.nspname || '.' || conname, pg_get_constraintdef(k.oid)
  FROM pg_constraint k JOIN pg_namespace n ON n.oid = k.connamespace
 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
ORDER BY 1, 2, 3
"""


def _schema(url: str) -> list[tuple[str, str, str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = [(r[0], r[1], r[2]) for r in conn.execute(text(SCHEMA))]
            rows += [
                ("version", v, "")
                for v in conn.execute(text("SELECT * FROM alembic_version")).scalars()
            ]
            return rows
    finally:
        engine.dispose()


def _all_at_once(n: int, call: Callable[[], object]) -> None:
    """`call` in n threads released together; every one returns, none raises."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def one() -> None:
        try:
            barrier.wait(30)
            call()
        except BaseException as exc:  # reported below, whatever it is
            errors.append(exc)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a call is still waiting"
    assert errors == []


class Databases:
    """Fresh, empty databases on the session's server, dropped at the end."""

    def __init__(self) -> None:
        self.base = make_url(get_settings().database_url)
        self.admin = create_engine(self.base.set(database="postgres"), isolation_level="AUTOCOMMIT")
        self.names: list[str] = []

    def fresh(self) -> str:
        name = f"am_deploy_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        self.names.append(name)
        return self.base.set(database=name).render_as_string(hide_password=False)

    def close(self) -> None:
        with self.admin.connect() as c:
            for name in self.names:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.admin.dispose()


@pytest.fixture(scope="module")
def databases() -> Iterator[Databases]:
    dbs = Databases()
    yield dbs
    dbs.close()


@pytest.fixture(scope="module")
def single_run(databases: Databases) -> list[tuple[str, str, str]]:
    url = databases.fresh()
    out = run_module("memory_core.cli", "migrate", env={"DATABASE_URL": url})
    assert out.returncode == 0, out.stderr
    return _schema(url)


def test_four_migrate_commands_at_once_all_succeed_with_the_schema_of_one(
    databases: Databases, single_run: list[tuple[str, str, str]]
) -> None:
    url = databases.fresh()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "memory_core.cli", "migrate"],
            cwd=REPO,
            env={**os.environ, "DATABASE_URL": url},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [(p.wait(120), p.communicate()) for p in procs]
    assert [rc for rc, _ in results] == [0, 0, 0, 0], [err for _, (_, err) in results]
    assert _schema(url) == single_run


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(n=st.integers(2, 6), downgraded_first=st.booleans())
def test_concurrent_upgrades_all_succeed_with_the_schema_of_one(
    n: int, downgraded_first: bool, databases: Databases, single_run: list[tuple[str, str, str]]
) -> None:
    url = databases.fresh()
    if downgraded_first:  # an upgrade from a schema part of the way up, as after a rollback
        upgrade(url, "base")
    _all_at_once(n, partial(upgrade, url))
    assert [r for r in _schema(url) if not r[1].startswith("langgraph.")] == [
        r for r in single_run if not r[1].startswith("langgraph.")
    ]


def test_checkpointer_setups_at_once_all_succeed(databases: Databases) -> None:
    """Agents that set the checkpointer up at start-up, several at once: a setup waiting
    inside Postgres for the lock held a snapshot the holder's CREATE INDEX CONCURRENTLY waited
    for."""
    from memory_core.langgraph import langgraph_available, setup_checkpointer

    if not langgraph_available():
        pytest.skip("the langgraph extra is not installed")
    url = databases.fresh()
    _all_at_once(4, partial(setup_checkpointer, url))


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_workers_started_at_once_on_a_fresh_database_all_serve_each_job_once(
    databases: Databases, start_worker: Callable[..., WorkerProcess], broker: str
) -> None:
    """Three finalize workers started together (a rollout: each declares the queues, with
    their quorum and dead-letter arguments on RabbitMQ, and records its settings) on a freshly
    migrated database: all are ready, and 30 turns sent to them land once each, in order."""
    url = databases.fresh()
    upgrade(url)
    fresh = {"DATABASE_URL": url}
    started: list[WorkerProcess] = []
    _all_at_once(
        3, lambda: started.append(start_worker(queues="memory.finalize", concurrency=1, env=fresh))
    )
    assert len(started) == 3
    assert all(w.proc is not None and w.proc.poll() is None for w in started)
    agent, tid = producer(broker), uuid.uuid4()
    for n in range(1, 31):
        send_finalize(agent, make_snapshot(tid, n))
    engine = create_engine(url)
    try:

        def seqs() -> list[int] | None:
            with engine.connect() as conn:
                got = list(
                    conn.scalars(
                        text("SELECT seq FROM thread_messages WHERE thread_id = :t ORDER BY seq"),
                        {"t": tid},
                    )
                )
            return got if len(got) >= 30 else None

        assert wait_for(seqs, timeout_s=120, what="30 turns") == list(range(1, 31))
    finally:
        engine.dispose()
