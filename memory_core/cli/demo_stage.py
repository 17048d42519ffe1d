"""The demo's stage: private services, a broker of its own, workers, a producer, and a stop.

`Stage` sets up what `agent-memory demo` (demo.py) and `agent-memory eval fidelity`
(memory_core/eval/runner.py) play on, sends turns by name as an agent service would, waits
for what the worker does, and stops everything it started, in order, whatever happened.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

from celery import Celery
from rich.console import Console
from rich.text import Text
from sqlalchemy import Engine, text

from memory_core.cli.demo_script import OWNER, Turn
from memory_core.cli.errors import safe_url
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.devservices import DevServices, ensure_services
from memory_core.devservices.poll import WaitTimeout, wait_for
from memory_core.devservices.private_broker import PrivateBroker, claim_redis_db, create_vhost
from memory_core.devservices.signals import deferred
from memory_core.devservices.system import DevServicesError
from memory_core.devservices.workers import QUEUES, WorkerProcess
from memory_core.events import MEMORY_SUMMARIZATION_FAILED as FOLD_FAILED
from memory_core.events import MEMORY_SUMMARIZED as FOLDED
from memory_core.events import Event, routine_stream
from memory_core.io.db import get_engine, reset_engines
from memory_core.io.queues import (
    FINALIZE_QUEUE,
    FINALIZE_TASK,
    is_amqp,
    publish_options,
    task_reprs,
)
from memory_core.io.redis_client import make_redis
from memory_core.migrate import upgrade
from memory_core.settings import Settings

# Summary bound for the demo's workers: the LLM-free fold fills its whole bound (default 1500
# tokens), which would leave no room for recent exchanges in an 800-token view. An explicit
# MEMORY_SUMMARY_MAX_TOKENS wins.
DEMO_BOUND = "400"
BROKER_DB = 2  # the broker db claimed on REDIS_URL's server, unless CELERY_BROKER_URL is set
WORKER_LOG_TAIL = 30  # lines of a worker's log shown when it did not stop cleanly
LLM_FREE = (
    "summaries: LLM-free deterministic fold (set OPENAI_BASE_URL/OPENAI_API_KEY to use an LLM)"
)
T = TypeVar("T")


class DemoError(RuntimeError):
    """A step failed; the message is the one line the user sees."""


def first_line(exc: BaseException) -> str:
    line = (str(exc).strip().splitlines() or [""])[0]
    return line if isinstance(exc, DemoError) else f"{type(exc).__name__}: {line}"


class Stage:
    memory: RedisConversationMemory  # these three are set by setup()
    engine: Engine
    producer: Celery

    def __init__(self, console: Console, data_dir: Path) -> None:
        self.out, self.data_dir = console, data_dir
        self.run_id = uuid.uuid4().hex[:8]
        self.stream = f"memory:events:demo:{self.run_id}"
        self.services: DevServices | None = None
        self.broker: PrivateBroker | None = None
        self.workers: list[WorkerProcess] = []
        self.settings = Settings()
        self.thread_id = uuid.uuid4()
        self.last_events: dict[str, str] = {}
        explicit = "memory_summary_max_tokens" in self.settings.model_fields_set
        self.bound = str(self.settings.memory_summary_max_tokens) if explicit else DEMO_BOUND

    def setup(self) -> None:
        s, out = self.settings, self.out
        out.rule("[bold]agent memory demo")
        self.services = services = ensure_services(s.database_url, s.redis_url, self.data_dir)
        for line in [*services.started, *services.notes]:
            out.print(line[:1].upper() + line[1:])
        private = " ".join(services.started + services.notes)
        if "PostgreSQL" not in private:
            out.print(f"using PostgreSQL at {safe_url(services.database_url)}")
        if "Redis" not in private:
            out.print(f"using Redis at {safe_url(services.redis_url)}")
        self.broker = self.own_broker(services.redis_url)
        broker = self.broker.url
        update = dict(database_url=services.database_url, redis_url=services.redis_url)
        update |= dict(celery_broker_url=broker, memory_events_stream=self.stream)
        self.settings = s = s.model_copy(update=update)
        self.engine = get_engine(s.database_url)
        self.memory = RedisConversationMemory(make_redis(s.redis_url), settings=s)
        # The agent side: a Celery app of its own that knows the memory jobs only by name.
        self.producer = Celery("analytics-agent", broker=broker, set_as_current=False)
        self.producer.conf.update(task_serializer="json", broker_connection_retry=False)
        # Celery prefers CELERY_BROKER_URL to `broker=`; the read/write URLs win over both.
        self.producer.conf.update(broker_read_url=broker, broker_write_url=broker)
        if is_amqp(broker):  # a send that returned is on the broker's disk
            self.producer.conf.broker_transport_options = {"confirm_publish": True}
        out.print(f"Celery broker: {safe_url(broker)} ({self.broker.why})")
        llm = f"LLM {s.memory_summarizer_model} at {s.openai_base_url or 'api.openai.com'}"
        out.print(f"summaries: {llm}" if s.llm_configured else LLM_FREE)
        out.print(f"summary bound {self.bound} tokens (MEMORY_SUMMARY_MAX_TOKENS, default 1500)")
        upgrade(s.database_url)
        out.print("schema migrated (alembic upgrade head)")
        self.start_worker({})

    def start_worker(self, extra: dict[str, str]) -> None:
        s = self.settings
        env = dict(os.environ, PYTHONUNBUFFERED="1", MEMORY_EVENTS_STREAM=self.stream)
        env |= dict(DATABASE_URL=s.database_url, REDIS_URL=s.redis_url)
        env |= dict(CELERY_BROKER_URL=s.celery_broker_url, MEMORY_WORKER_SOFT_SHUTDOWN_S="0")
        env |= dict(OPENAI_BASE_URL=s.openai_base_url or "", OPENAI_API_KEY=s.openai_api_key or "")
        env |= {"MEMORY_SUMMARY_MAX_TOKENS": self.bound, **extra}
        name = f"demo-{self.run_id}-{len(self.workers) + 1}"
        worker = WorkerProcess(self.data_dir, name=name, env=env)
        self.workers.append(worker)
        t0 = time.monotonic()
        worker.start()
        self.out.print(
            f"worker {name} ready in {time.monotonic() - t0:.1f}s (pid {worker.pid}; "
            f"queues {QUEUES}; 2 prefork children)"
        )

    def send(self, tid: uuid.UUID, turn: Turn, agent_type: str) -> None:
        ids = dict(session_id=str(uuid.uuid4()), thread_id=str(tid), owner_id=OWNER)
        snapshot = {**asdict(turn), **ids, "agent_type": agent_type}
        snapshot["response_payload"] = {"blocks": [{"type": "markdown", "text": turn.answer}]}
        snapshot["completed_at"] = datetime.now(UTC).isoformat()
        where = publish_options(self.settings.celery_broker_url, FINALIZE_QUEUE)
        self.producer.send_task(FINALIZE_TASK, args=[snapshot], **where, **task_reprs([snapshot]))

    def row(self, tid: uuid.UUID, min_seq: int = 1) -> Any:
        """The thread row once it holds turn `min_seq`, else None."""
        query = "SELECT last_seq, summary FROM conversation_threads WHERE id = CAST(:id AS uuid)"
        with self.engine.connect() as conn:
            row = conn.execute(text(query), {"id": str(tid)}).one_or_none()
        return row if row is not None and row.last_seq >= min_seq else None

    def fold_event(self, tid: uuid.UUID) -> Event | None:
        """The thread's next fold outcome on this run's event streams, if there is one yet.

        Failures are on the stream itself, successful folds on its routine stream.
        """
        for stream in (self.stream, routine_stream(self.stream)):
            start = self.last_events.get(stream, "0-0")
            page = self.memory.redis.xrange(stream, min=f"({start}", count=100)
            for eid, raw in cast(list[Any], page):
                event = Event.from_entry(eid, raw)
                self.last_events[stream] = event.id
                if event.thread_id == str(tid) and event.event == FOLDED:
                    return event
                if event.thread_id == str(tid) and event.event == FOLD_FAILED:
                    raise DemoError(f"fold failed: {event.error}")
        return None

    def wait(self, what: str, check: Callable[[], T | None], timeout_s: float) -> T:
        def checked() -> T | None:
            for w in self.workers:
                w.check()  # a worker that died fails the demo at once
            return check()

        try:
            return wait_for(checked, timeout_s, what, interval_s=0.02)
        except WaitTimeout as exc:
            logs = ", ".join(str(w.log_path) for w in self.workers) or "no worker started"
            raise DemoError(f"{exc} ({logs})") from None

    def own_broker(self, redis_url: str) -> PrivateBroker:
        """A broker of this run's own, never one agents may use (devservices.private_broker):
        CELERY_BROKER_URL when set apart from REDIS_URL (a RabbitMQ vhost made for the run,
        or its Redis database if empty), else db BROKER_DB of REDIS_URL's server if empty."""
        s = self.settings
        explicit = s.celery_broker_url != s.redis_url
        url = s.celery_broker_url if explicit else _redis_db(redis_url, BROKER_DB)
        why = "CELERY_BROKER_URL" if explicit else f"db {BROKER_DB} of REDIS_URL's server"
        try:
            if is_amqp(url):
                return create_vhost(url, self.run_id, search=self.data_dir.parent)
            return claim_redis_db(url, self.run_id, why)
        except DevServicesError as exc:
            raise DemoError(str(exc)) from None
        except Exception as exc:
            raise DemoError(f"cannot reach the broker at {safe_url(url)}: {exc}") from exc

    def stop(self) -> list[str]:
        """Stop what this run started (workers first, private servers last); the errors."""
        steps: list[tuple[str, Callable[[], object]]] = [(w.name, w.stop) for w in self.workers]
        if hasattr(self, "producer"):
            steps += [("producer", self.producer.close)]
        if self.broker is not None:  # only the broker it made its own, and once its workers end
            steps += [("the run's broker", partial(self._release_broker, self.broker))]
        if hasattr(self, "memory"):
            redis = self.memory.redis
            streams = (self.stream, routine_stream(self.stream))
            steps += [("event streams", lambda: [redis.expire(x, 86_400) for x in streams])]
            steps += [("redis client", redis.close)]
        steps.append(("database pool", reset_engines))
        if self.services is not None:
            steps.append(("private services", self.services.stop))
        errors: list[str] = []
        with deferred(raise_after=False):  # a signal now must not cut the stop short
            for what, step in steps:
                try:
                    step()
                except Exception as exc:
                    errors.append(f"stopping {what}: {first_line(exc)}")
        for w in self.workers:
            self.out.print(f"stopped worker {w.name} (exit code {w.exit_code})")
            if w.exit_code != 0:  # an unclean stop fails the demo and shows why (log kept)
                errors.append(f"worker {w.name} exited with code {w.exit_code}: {w.log_path}")
                self.out.print(Text("\n".join(w.log().splitlines()[-WORKER_LOG_TAIL:])))
        if self.services is not None and self.services.started:
            self.out.print("stopped the private PostgreSQL/Redis this demo started")
        return errors

    def _release_broker(self, broker: PrivateBroker) -> None:
        self.out.print(f"broker: {broker.release()}")


def _redis_db(url: str, db: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))
