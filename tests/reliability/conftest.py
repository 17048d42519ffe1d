"""The reliability suite's world: its own PostgreSQL and Redis, subprocess workers, a fake LLM.

The package-scoped `stack` starts a private PostgreSQL (initdb) and a private Redis (AOF on)
on spare ports, points this process's settings (and so every worker it starts) at them, and
restores the environment afterwards: the suite may stop, kill and restart both servers without
disturbing any other test session on the machine.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog
from celery import Celery
from sqlalchemy import func, select

from memory_core.db import reset_engines, session_scope
from memory_core.fold_publisher import publisher_app
from memory_core.migrate import upgrade
from memory_core.models import ConversationThread, ThreadMessage
from memory_core.redis_client import reset_redis_clients
from memory_core.settings import get_settings, reset_settings_cache
from tests.fakes.llm_server import FakeLLMServer
from tests.reliability.services import PrivatePostgres, PrivateRedis, make_data_dir, remove_tree
from tests.workers.harness import REPO, WorkerProcess, producer, worker_test_env

DATABASE = "agent_memory_reliability"
_ENV_KEYS = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "MEMORY_EVENTS_STREAM")


@dataclass
class Stack:
    pg: PrivatePostgres
    redis: PrivateRedis
    data_dir: Path

    @property
    def database_url(self) -> str:
        return self.pg.url

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis.url)


def _reset_clients() -> None:
    reset_settings_cache()
    reset_engines()
    reset_redis_clients()
    publisher_app.cache_clear()


@pytest.fixture(scope="package")
def stack() -> Iterator[Stack]:
    data_dir = make_data_dir(REPO / ".agent-memory" / "reliability")
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    # The in-process agents meet thousands of injected faults: keep their logs out of -s output.
    saved_logging = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    redis_server = PrivateRedis(data_dir)
    pg: PrivatePostgres | None = None
    try:
        pg = PrivatePostgres(data_dir, DATABASE, redis_server.url)
        os.environ.update(
            DATABASE_URL=pg.url, REDIS_URL=redis_server.url, CELERY_BROKER_URL=redis_server.url
        )
        os.environ.pop("MEMORY_EVENTS_STREAM", None)
        _reset_clients()
        upgrade(get_settings().database_url)
        yield Stack(pg, redis_server, data_dir)
    finally:
        structlog.configure(**saved_logging)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _reset_clients()
        if pg is not None:
            pg.close()
            if pg.services.pg_data_dir is not None:
                remove_tree(pg.services.pg_data_dir)
        redis_server.close()
        remove_tree(data_dir)


@pytest.fixture(autouse=True)
def _fresh_redis(stack: Stack) -> Iterator[None]:
    """Every scenario starts with an empty broker (no job of an earlier scenario left over)."""
    client = stack.client()
    client.flushall()
    client.close()
    yield
    _reset_clients()


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(delay_s=3.0) as server:
        yield server


@pytest.fixture
def events_stream() -> str:
    return f"memory:events:reliability:{uuid.uuid4().hex[:8]}"


@pytest.fixture
def worker_env(llm: FakeLLMServer, events_stream: str) -> dict[str, str]:
    return worker_test_env(llm.base_url, events_stream)


LOG_DIR = REPO / ".agent-memory" / "reliability" / "logs"


@pytest.fixture
def start_worker(
    stack: Stack, request: pytest.FixtureRequest, worker_env: dict[str, str]
) -> Iterator[Callable[..., WorkerProcess]]:
    """Subprocess workers; their logs stay in .agent-memory/reliability/logs/<test>/ (CI)."""
    started: list[WorkerProcess] = []
    logs = LOG_DIR / request.node.name[:80]
    remove_tree(logs)
    logs.mkdir(parents=True)

    def start(**kwargs: Any) -> WorkerProcess:
        env = {**worker_env, **kwargs.pop("env", {})}
        w = WorkerProcess(logs, env=env, **kwargs)
        started.append(w)
        return w.start()

    yield start
    for w in started:
        w.terminate(30)


@pytest.fixture
def agent(stack: Stack) -> Celery:
    return producer()


# ------------------------------------------------------------------ shared checks


def stored(tids: Iterable[uuid.UUID]) -> dict[uuid.UUID, list[tuple[int, str]]]:
    """(seq, session_id) of every stored turn, per thread, in seq order."""
    ids = list(tids)
    out: dict[uuid.UUID, list[tuple[int, str]]] = {t: [] for t in ids}
    with session_scope() as s:
        rows = s.execute(
            select(ThreadMessage.thread_id, ThreadMessage.seq, ThreadMessage.session_id)
            .where(ThreadMessage.thread_id.in_(ids))
            .order_by(ThreadMessage.thread_id, ThreadMessage.seq)
        ).all()
    for tid, seq, sid in rows:
        out[tid].append((seq, str(sid)))
    return out


def count_stored(tids: Iterable[uuid.UUID]) -> int:
    with session_scope() as s:
        return int(
            s.scalar(select(func.count()).where(ThreadMessage.thread_id.in_(list(tids)))) or 0
        )


def landed(session_ids: Iterable[str]) -> set[str]:
    ids = [uuid.UUID(x) for x in session_ids]
    if not ids:
        return set()
    with session_scope() as s:
        return {
            str(x)
            for x in s.scalars(
                select(ThreadMessage.session_id).where(ThreadMessage.session_id.in_(ids))
            )
        }


def thread_rows(tids: Iterable[uuid.UUID]) -> dict[uuid.UUID, ConversationThread]:
    with session_scope() as s:
        rows = s.scalars(select(ConversationThread).where(ConversationThread.id.in_(list(tids))))
        return {t.id: t for t in rows}


@dataclass
class Tally:
    """Exactly-once bookkeeping of a load: what was sent against what Postgres holds."""

    sent: dict[str, uuid.UUID]  # session_id -> thread_id

    def check(self) -> tuple[int, int, dict[uuid.UUID, list[tuple[int, str]]]]:
        """(lost, duplicated, rows); duplicated counts extra rows and seq gaps/repeats."""
        tids = set(self.sent.values())
        rows = stored(tids)
        stored_sids = [sid for per in rows.values() for _, sid in per]
        lost = len(set(self.sent) - set(stored_sids))
        duplicated = len(stored_sids) - len(set(stored_sids))
        duplicated += len(set(stored_sids) - set(self.sent))  # a row nobody sent
        return lost, duplicated, rows


def assert_gapless(rows: dict[uuid.UUID, list[tuple[int, str]]]) -> None:
    for tid, per in rows.items():
        seqs = [seq for seq, _ in per]
        assert seqs == list(range(1, len(seqs) + 1)), f"seq gap or repeat in {tid}: {seqs}"


def _finalize_session_ids(messages: Iterable[Any]) -> set[str]:
    out: set[str] = set()
    for message in messages:
        try:
            if message["headers"].get("task") != "memory.finalize_turn":
                continue
            args = json.loads(base64.b64decode(message["body"]))[0]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
        if args and isinstance(args[0], dict) and isinstance(args[0].get("session_id"), str):
            out.add(args[0]["session_id"])
    return out


def held_finalize_jobs(client: redis.Redis) -> set[str]:
    """session_ids of the finalize jobs workers hold unacked (the Redis broker's `unacked`)."""
    return _finalize_session_ids(json.loads(raw)[0] for raw in client.hvals("unacked"))


def queued_finalize_jobs(client: redis.Redis) -> set[str]:
    """session_ids of the finalize jobs waiting in the `memory.finalize` queue."""
    return _finalize_session_ids(json.loads(raw) for raw in client.lrange("memory.finalize", 0, -1))


def wait_until(
    predicate: Callable[[], Any],
    timeout_s: float,
    what: str,
    diagnostics: Callable[[], str] | None = None,
    interval_s: float = 0.1,
) -> float:
    """Seconds it took for `predicate` to hold; AssertionError (with diagnostics) on timeout."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            extra = "\n" + diagnostics()[-6000:] if diagnostics else ""
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{extra}")
        time.sleep(interval_s)
    return time.monotonic() - started
