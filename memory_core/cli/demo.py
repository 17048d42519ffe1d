"""`agent-memory demo` (`make demo`): a scripted analytics conversation through a real worker.

Finds or starts PostgreSQL and Redis, migrates, starts a Celery worker subprocess, and plays
`demo_script.CONVERSATION` as `memory.finalize_turn` jobs sent by name from a separate producer
app (as an agent service would). Shows the folds as they happen, the three node views, a
rehydration from Postgres and a fold against an unreachable LLM; then stops what it started.
"""

from __future__ import annotations

import os
import re
import signal
import sys
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
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from memory_core.cli.demo_script import CONVERSATION, FOLLOW_UP, OWNER, VIEWS, Turn, failure_turn
from memory_core.context import ConversationContext
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.db import get_engine, reset_engines
from memory_core.devservices import DevServices, ensure_services, signals
from memory_core.devservices.poll import WaitTimeout, wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.private_broker import PrivateBroker, claim_redis_db, create_vhost
from memory_core.devservices.signals import Interrupted, deferred, ending_on_signals
from memory_core.devservices.system import DevServicesError
from memory_core.devservices.workers import QUEUES, WorkerProcess
from memory_core.events import MEMORY_SUMMARIZATION_FAILED as FOLD_FAILED
from memory_core.events import MEMORY_SUMMARIZED as FOLDED
from memory_core.events import Event, EventConsumer, format_event, routine_stream
from memory_core.migrate import upgrade
from memory_core.queues import FINALIZE_QUEUE, FINALIZE_TASK, is_amqp, publish_options, task_reprs
from memory_core.redis_client import make_redis
from memory_core.settings import Settings
from memory_core.tokens import count_tokens
from memory_core.views import render_conversation_context

BUDGET = 1000  # tokens per node view
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


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _first_line(exc: BaseException) -> str:
    line = (str(exc).strip().splitlines() or [""])[0]
    return line if isinstance(exc, DemoError) else f"{type(exc).__name__}: {line}"


class Demo:
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

    def run(self) -> None:
        self.setup()
        self.play()
        self.show_rehydration(self.show_views())
        self.show_failure()

    def setup(self) -> None:
        s, out = self.settings, self.out
        out.rule("[bold]agent memory demo")
        self.services = services = ensure_services(s.database_url, s.redis_url, self.data_dir)
        for line in [*services.started, *services.notes]:
            out.print(line[:1].upper() + line[1:])
        private = " ".join(services.started + services.notes)
        if "PostgreSQL" not in private:
            out.print(f"using PostgreSQL at {_safe(services.database_url)}")
        if "Redis" not in private:
            out.print(f"using Redis at {_safe(services.redis_url)}")
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
        out.print(f"Celery broker: {_safe(broker)} ({self.broker.why})")
        llm = f"LLM {s.memory_summarizer_model} at {s.openai_base_url or 'api.openai.com'}"
        out.print(f"summaries: {llm}" if s.llm_configured else LLM_FREE)
        out.print(f"summary bound {self.bound} tokens (MEMORY_SUMMARY_MAX_TOKENS, default 1500)")
        upgrade(s.database_url)
        out.print("schema migrated (alembic upgrade head)")
        self.start_worker({})

    def play(self) -> None:
        s, tid, total = self.settings, self.thread_id, len(CONVERSATION)
        threshold = self.memory.compression_threshold
        self.out.rule(f"[bold]{total} turns of an analytics conversation")
        self.out.print(f"thread {tid}, owner {OWNER}: one memory.finalize_turn job per turn")
        folds = through = 0
        columns = [TextColumn("turn"), MofNCompleteColumn(), BarColumn()]
        columns.append(TextColumn("{task.fields[q]}"))
        with Progress(*columns, console=self.out) as progress:
            bar = progress.add_task("turns", total=total, q="")
            for n, turn in enumerate(CONVERSATION, 1):
                progress.update(bar, q=escape(turn.user_query[:48]))
                self.send(tid, turn, "chat")
                self.wait(f"turn {n} to land", partial(self.row, tid, n), 30)
                progress.advance(bar)
                if n - through <= threshold:
                    continue  # no fold due
                t0 = time.monotonic()
                limit = s.memory_llm_timeout_s + 30 if s.llm_configured else 60
                event = self.wait(f"the fold after turn {n}", partial(self.fold_event, tid), limit)
                upto, folds = int(event.fields.get("through_seq", "0")), folds + 1
                summary_tokens = count_tokens(self.row(tid).summary or "")
                progress.console.print(
                    f"  turn {n}: fold {folds} folded turns {through + 1}-{upto} into the summary "
                    f"({event.fields.get('prompt')}, {summary_tokens} tokens, "
                    f"{time.monotonic() - t0:.2f}s); turns {upto + 1}-{n} stay verbatim"
                )
                through = upto

    def show_views(self) -> ConversationContext:
        ctx = self.memory.get_context(self.thread_id, OWNER)
        self.out.rule("[bold]three node views of the same memory")
        self.out.print(
            f'follow-up question: "{FOLLOW_UP}"; memory: summary through turn '
            f"{ctx.summary_through_seq} + {len(ctx.recent)} recent turns; budget {BUDGET} tokens"
        )
        for focus, consumer in VIEWS:
            view = render_conversation_context(ctx, focus, max_tokens=BUDGET)
            tokens = count_tokens(view)
            shown = len(re.findall(r"^\[#\d+\] User:", view, re.MULTILINE))
            title = f"focus={focus} - {tokens} tokens"
            self.out.print(Panel(Text(view.rstrip()), title=title, subtitle=consumer))
            self.out.print(
                f"view focus={focus}: {tokens}/{BUDGET} tokens = summary + newest {shown} of "
                f"{len(ctx.recent)} recent exchanges"
            )
        return ctx

    def show_rehydration(self, ctx: ConversationContext) -> None:
        memory, out = self.memory, self.out
        out.rule("[bold]the Redis copy expires, Postgres remembers")
        keys = memory.copy.keys(self.thread_id)
        memory.invalidate(self.thread_id)
        if memory.redis.exists(*keys):
            raise DemoError("the Redis working copy survived invalidate()")
        out.print(f"deleted the Redis working copy ({keys[0]} ...), as if its TTL had expired")
        again = memory.get_context(self.thread_id, OWNER)
        if again != ctx:
            raise DemoError("the context rehydrated from Postgres differs from the Redis copy")
        ttl_h = memory.redis.pttl(keys[0]) / 3_600_000
        out.print(
            f"get_context: rehydrated from Postgres: identical (summary + {len(again.recent)} "
            f"turns; the Redis copy is rebuilt with a {ttl_h:.0f}h TTL)"
        )

    def show_failure(self) -> None:
        memory, out = self.memory, self.out
        out.rule("[bold]a fold against an unreachable LLM")
        for w in self.workers:
            w.stop()
        llm = f"http://127.0.0.1:{free_port()}/v1"  # a port nothing listens on
        out.print(f"stopped the worker; starting another with OPENAI_BASE_URL={llm} (closed port)")
        env = {"OPENAI_BASE_URL": llm, "OPENAI_API_KEY": "dummy", "MEMORY_LLM_TIMEOUT_S": "2"}
        self.start_worker({**env, "LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""})
        group = f"demo-{self.run_id}"
        consumer = EventConsumer(memory.redis, group, "demo", stream=self.stream)
        consumer.ensure_group(start_id="$")
        tid, n = uuid.uuid4(), memory.compression_threshold + 1
        for i in range(1, n + 1):
            self.send(tid, failure_turn(i), "copilot")
        self.wait(f"{n} quick turns to land", partial(self.row, tid, n), 60)
        out.print(f"second thread {tid}: {n} quick copilot turns landed, a fold is due")

        def failed() -> Event | None:
            events = consumer.read(count=10, block_ms=200)
            consumer.ack(*(e.id for e in events))
            hits = (e for e in events if e.event == FOLD_FAILED)
            return next((e for e in hits if e.thread_id == str(tid)), None)

        event = self.wait("the memory_summarization_failed event", failed, 60)
        # The task emits the event, then publishes its retry. The workers stop with no soft
        # shutdown: a stop in the middle of that publish left the child waiting for the
        # broker's answer (RabbitMQ) until it was killed. Stop once the retry is queued.
        worker = self.workers[-1]
        self.wait("the fold's retry to be queued", partial(_retry_logged, worker), 30)
        out.print(f"read through consumer group {group}:")
        out.print(Text(format_event(event)), soft_wrap=True)
        retry = "?" if event.retry_in_s is None else f"{event.retry_in_s:g}"
        out.print(f"attempt={event.attempt} retry_in_s={retry} (then 120, 240, ... up to 3600)")
        if event.attempt != 1 or event.retry_in_s != 60:
            raise DemoError(f"unexpected failure event: {format_event(event)}")
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT count(*) FROM thread_messages WHERE thread_id = CAST(:id AS uuid)"),
                {"id": str(tid)},
            ).scalar_one()
        ctx = memory.get_context(tid, OWNER)
        if rows != n or len(ctx.recent) != n or ctx.summary is not None:
            raise DemoError(f"turns lost: {rows} rows and {len(ctx.recent)} cached of {n}")
        out.print(
            f"no turn was lost: {rows}/{n} rows in thread_messages, {len(ctx.recent)} turns in "
            "the Redis working copy, no summary yet (the fold retries in 60 s)"
        )

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
                return create_vhost(url, self.run_id)
            return claim_redis_db(url, self.run_id, why)
        except DevServicesError as exc:
            raise DemoError(str(exc)) from None
        except Exception as exc:
            raise DemoError(f"cannot reach the broker at {_safe(url)}: {exc}") from exc

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
                    errors.append(f"stopping {what}: {_first_line(exc)}")
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

    def recap(self, wall_s: float) -> None:
        s, out = self.settings, self.out
        private = bool(self.services and self.services.started)
        out.rule("[bold]what you just saw")
        out.print(
            f"An agent-side Celery app sent {len(CONVERSATION)} memory.finalize_turn jobs by name. "
            "The worker committed each turn to Postgres first (conversation_threads + "
            "thread_messages, idempotent on session_id), then updated the Redis working copy; "
            f"past {self.memory.compression_threshold} unfolded turns it queued "
            "memory.fold_thread, which folded the oldest turns into the thread's running summary "
            "and kept the newest verbatim. Each workflow node renders its own view of that memory "
            "under a token budget, always keeping the summary. Deleting the Redis copy lost "
            "nothing: get_context rebuilt it from Postgres, identical. With the LLM unreachable "
            "the fold failed loudly (a memory_summarization_failed event, retry in 60 s with "
            "backoff) and every turn stayed safe."
        )
        out.print(f"\ndemo finished in {wall_s:.1f}s. Next, try:")
        if private:
            out.print(
                f'  eval "$({sys.executable} -m memory_core.devservices --data-dir '
                f'{self.data_dir})"   # restart the private servers and export their URLs'
            )
        out.print(
            f"  agent-memory context {self.thread_id} --owner {OWNER} --focus sql\n"
            f"  agent-memory threads --owner {OWNER}\n"
            f"  MEMORY_EVENTS_STREAM={self.stream} agent-memory events tail --from-start"
        )
        if not private:
            out.print(f"  (database {_safe(s.database_url)}, Redis {_safe(s.redis_url)})")


def _retry_logged(worker: WorkerProcess) -> bool:
    """Whether the worker logged a fold's retry as sent (Celery's "Task ...[id] retry:")."""
    return any(
        "Task memory.fold_thread[" in line and "] retry: " in line
        for line in worker.log().splitlines()
    )


def run_demo(data_dir: Path | None = None) -> int:
    """Play the demo; 0 on success, else a one-line error on stderr and a non-zero code.

    SIGTERM, SIGINT and SIGHUP all end it, and everything it started ends with it: the first
    signal raises `Interrupted` where the demo is (devservices.signals), the stop then runs to
    its end. It raises at most once, so a stop it cut short is run again (each step is
    idempotent), and the exit code is 128 + the signal.
    """
    t0 = time.monotonic()
    out, err = Console(highlight=False), Console(stderr=True, highlight=False)
    demo = Demo(out, (data_dir or Path.cwd() / ".agent-memory" / "demo").resolve())
    code, error, played = 0, "", False
    stop_errors: list[str] | None = None
    with ending_on_signals():
        while stop_errors is None:
            try:
                signals.arm()
                if not played:
                    played = True
                    code, error = _play(demo)
                out.rule("[bold]cleaning up")
                stop_errors = demo.stop()
            except Interrupted:
                continue
        signum = signals.received()
    if signum is not None:
        code, error = 128 + signum, f"stopped by {signal.Signals(signum).name}"
    if stop_errors and not code:
        code, error = 1, "; ".join(stop_errors)
    if code:
        err.print(f"demo failed: {error}", markup=False, soft_wrap=True)
        return code
    for w in demo.workers:  # logs are kept only when something went wrong
        w.log_path.unlink(missing_ok=True)
    demo.recap(time.monotonic() - t0)
    return 0


def _play(demo: Demo) -> tuple[int, str]:
    try:
        demo.data_dir.mkdir(parents=True, exist_ok=True)
        demo.run()
    except KeyboardInterrupt:
        return 130, "interrupted"
    except Exception as exc:
        return 1, _first_line(exc)
    return 0, ""


def _redis_db(url: str, db: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))
