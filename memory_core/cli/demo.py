"""`agent-memory demo` (`make demo`): a scripted analytics conversation through a real worker.

Finds or starts PostgreSQL and Redis, migrates, starts a Celery worker subprocess, and plays
`demo_script.CONVERSATION` as `memory.finalize_turn` jobs sent by name from a separate producer
app (as an agent service would). Shows the folds as they happen, the three node views, a
rehydration from Postgres and a fold against an unreachable LLM; then stops what it started.
"""

from __future__ import annotations

import re
import signal
import sys
import time
import uuid
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text
from sqlalchemy import text

from memory_core.cli.demo_script import CONVERSATION, FOLLOW_UP, OWNER, VIEWS, failure_turn
from memory_core.cli.demo_stage import DemoError, Stage, first_line
from memory_core.cli.errors import safe_url
from memory_core.copy.context import ConversationContext
from memory_core.copy.views import render_conversation_context
from memory_core.devservices import signals
from memory_core.devservices.ports import free_port
from memory_core.devservices.signals import Interrupted, ending_on_signals
from memory_core.devservices.workers import WorkerProcess
from memory_core.events import MEMORY_SUMMARIZATION_FAILED as FOLD_FAILED
from memory_core.events import Event, EventConsumer, format_event
from memory_core.tokens import count_tokens

BUDGET = 1000  # tokens per node view


class Demo(Stage):
    """The demo's scenes on its stage: the conversation, the views, a rehydration, a failure."""

    def run(self) -> None:
        self.setup()
        self.play()
        self.show_rehydration(self.show_views())
        self.show_failure()

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
            out.print(f"  (database {safe_url(s.database_url)}, Redis {safe_url(s.redis_url)})")


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
        return 1, first_line(exc)
    return 0, ""
