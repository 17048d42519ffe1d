"""Play the fidelity corpus through a real worker, then score the views after the last fold.

The run is `agent-memory demo`'s machinery (memory_core/cli/demo.py `Demo`): the configured
DATABASE_URL / REDIS_URL / CELERY_BROKER_URL (or private servers when they do not answer), an
Alembic upgrade, a Celery worker subprocess, and every turn sent by name as a
`memory.finalize_turn` job from a separate producer app. The worker runs with the configured
MEMORY_SUMMARY_MAX_TOKENS (the demo lowers it for its small views; the eval measures the
default). One thread per conversation, fresh ids on every run; turn n of every conversation is
sent, then awaited with the folds it made due, before turn n + 1: each thread's turns keep
their order, and every fold covers the same turns on every run (as when a user's messages are
minutes apart), so the figures do not depend on how fast the worker is.

Progress goes to the console the command hands in (stderr); the report is returned.
"""

from __future__ import annotations

import io
import uuid
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any, cast

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from sqlalchemy import text

from memory_core.cli.demo import Demo, DemoError
from memory_core.cli.demo_script import OWNER
from memory_core.copy.context import ConversationContext
from memory_core.copy.views import DEFAULT_MAX_TOKENS, render_conversation_context
from memory_core.eval.corpus import Conversation
from memory_core.eval.report import FOCI, aggregates, conversation_row
from memory_core.eval.scoring import score_view
from memory_core.events import MEMORY_SUMMARIZATION_FAILED as FOLD_FAILED
from memory_core.events import MEMORY_SUMMARIZED as FOLDED
from memory_core.events import Event, routine_stream
from memory_core.fold.summary_tail import stored_summary_bound, strip_artifact_tail
from memory_core.tokens import count_tokens

THREADS = """SELECT id, last_seq, summary, summary_through_seq, summary_prompt,
       fold_due_at IS NULL AND fold_lease_token IS NULL AS settled
FROM conversation_threads WHERE id = ANY(CAST(:ids AS uuid[]))"""


class EvalError(DemoError):
    """A step of the eval failed; the message is the one line the user sees."""


class FidelityRun(Demo):
    """The demo's services, worker and producer, playing the fidelity corpus instead."""

    def __init__(
        self,
        console: Console,
        data_dir: Path,
        conversations: tuple[Conversation, ...],
        declared: bool = False,
    ):
        super().__init__(console, data_dir)
        self.declared = declared
        self.run_id = f"eval-{self.run_id}"
        self.stream = f"memory:events:eval:{self.run_id}"
        self.bound = str(self.settings.memory_summary_max_tokens)
        self.conversations = conversations
        self.threads = {c.name: uuid.uuid4() for c in conversations}

    def setup(self) -> None:
        """The demo's setup, its output shown without the demo's title."""
        console, self.out = self.out, Console(file=io.StringIO(), width=1000)
        try:
            super().setup()
        finally:
            captured = cast(io.StringIO, self.out.file).getvalue()
            self.out = console
            for line in captured.splitlines():
                if line.strip() and "agent memory demo" not in line:
                    console.print(line.rstrip(), markup=False, highlight=False, soft_wrap=True)

    @property
    def llm(self) -> bool:
        return self.settings.llm_configured

    def rows(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
        with self.engine.connect() as conn:
            found = conn.execute(text(THREADS), {"ids": [str(i) for i in ids]}).all()
        return {row.id: row for row in found}

    def landed(self, ids: list[uuid.UUID], seq: int) -> bool:
        """Every thread holds turn `seq`, and no fold is due or running on any of them."""
        rows = self.rows(ids)
        return len(rows) == len(ids) and all(r.last_seq >= seq and r.settled for r in rows.values())

    def play(self) -> None:
        convs, total = self.conversations, sum(len(c.turns) for c in self.conversations)
        per_fold = self.settings.memory_llm_timeout_s + 30
        limit = 60 + len(convs) * per_fold if self.llm else 60
        self.out.print(f"playing {len(convs)} conversations, {total} turns (owner {OWNER})")
        columns = [TextColumn("turns"), MofNCompleteColumn(), BarColumn()]
        with Progress(*columns, console=self.out, transient=True) as progress:
            bar = progress.add_task("turns", total=total)
            for n in range(1, max(len(c.turns) for c in convs) + 1):
                live = [c for c in convs if len(c.turns) >= n]
                for conv in live:
                    self.send(self.threads[conv.name], conv.turns[n - 1], "chat")
                ids = [self.threads[c.name] for c in live]
                self.wait(f"turn {n} of {len(ids)} threads", partial(self.landed, ids, n), limit)
                progress.advance(bar, len(live))

    def settle(self) -> dict[uuid.UUID, Any]:
        """Wait until every turn is stored and no fold is due or running; the thread rows."""
        want = {self.threads[c.name]: len(c.turns) for c in self.conversations}
        per_fold = self.settings.memory_llm_timeout_s + 30
        limit = 300 + len(want) * per_fold if self.llm else 300

        def settled() -> dict[uuid.UUID, Any] | None:
            rows = self.rows(list(want))
            done = len(rows) == len(want)
            done = done and all(r.settled and r.last_seq == want[i] for i, r in rows.items())
            return rows if done else None

        self.out.print("all turns stored; waiting for the last folds")
        return self.wait("every thread's folds to finish", settled, limit)

    def fold_counts(self) -> tuple[Counter[str], Counter[str]]:
        """Folds and fold failures per thread id, from this run's event streams."""
        counts: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        wanted = ((routine_stream(self.stream), FOLDED, 0), (self.stream, FOLD_FAILED, 1))
        for stream, name, slot in wanted:
            start = "-"
            while page := cast(list[Any], self.memory.redis.xrange(stream, min=start, count=500)):
                events = [Event.from_entry(eid, raw) for eid, raw in page]
                counts[slot].update(e.thread_id for e in events if e.event == name)
                start = f"({events[-1].id}"
        return counts

    def context(self, tid: uuid.UUID, through: int) -> ConversationContext | None:
        """The thread's context once the working copy holds the last fold."""
        ctx = self.memory.get_context(tid, OWNER)
        return ctx if ctx.summary_through_seq == through else None

    def score(self, rows: dict[uuid.UUID, Any]) -> dict[str, Any]:
        folds, failures = self.fold_counts()
        bound = stored_summary_bound(int(self.bound))
        out = []
        for conv in self.conversations:
            tid = self.threads[conv.name]
            row = rows[tid]
            check = partial(self.context, tid, row.summary_through_seq)
            ctx = self.wait(f"the working copy of {conv.name}", check, 30)
            views = {f: render_conversation_context(ctx, f, DEFAULT_MAX_TOKENS) for f in FOCI}
            measured: dict[str, Any] = dict(
                thread_id=str(tid),
                last_seq=row.last_seq,
                folds=folds[str(tid)],
                fold_failures=failures[str(tid)],
                summary_through_seq=row.summary_through_seq,
                summary_prompt=row.summary_prompt,
                summary_tokens=count_tokens(row.summary or ""),
                summary_bound=bound,
                view_tokens={f: count_tokens(v) for f, v in views.items()},
            )
            scores = {f: score_view(conv, v) for f, v in views.items()}
            text_part = strip_artifact_tail(row.summary) or ""
            out.append(conversation_row(conv, scores, text_part, **measured))
        return self.report(out, bound)

    def report(self, rows: list[dict[str, Any]], bound: int) -> dict[str, Any]:
        s = self.settings
        llm = f"LLM {s.memory_summarizer_model} at {s.openai_base_url or 'api.openai.com'}"
        return {
            "summaries": llm if self.llm else "LLM-free fold",
            "instructions": "declared by the agent" if self.declared else "detected",
            "summary_prompts": sorted({r["summary_prompt"] or "none" for r in rows}),
            "summary_max_tokens": int(self.bound),
            "summary_bound": bound,
            "view_max_tokens": DEFAULT_MAX_TOKENS,
            "owner": OWNER,
            "conversations": rows,
            **aggregates(rows),  # tuning, holdout, overall
        }


def run_fidelity(
    console: Console,
    data_dir: Path,
    conversations: tuple[Conversation, ...],
    declared: bool = False,
) -> dict[str, Any]:
    """Run the eval; the report. `declared`: the conversations' agents declare (the report
    says so). Raises (DemoError and others) when a step fails; whatever the run started is
    stopped either way."""
    run = FidelityRun(console, data_dir, conversations, declared)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        run.setup()
        run.play()
        report = run.score(run.settle())
    finally:
        errors = run.stop()
    if errors:
        raise EvalError("; ".join(errors))
    for worker in run.workers:  # logs are kept only when something went wrong
        worker.log_path.unlink(missing_ok=True)
    return report
