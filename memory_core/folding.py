"""Folding: the oldest unfolded turns go into the running summary, one thread at a time.

Fold arithmetic (defaults): when a thread has more than `compression_threshold` (20) unfolded
turns, fold all of them except the newest `max_recent_messages` (10): the first fold happens
at turn 21 (turns 1-11), then every 11 turns. A late fold folds whatever is unfolded then,
except the newest 10, at most `max_unfolded_messages` turns per LLM call (a bounded prompt);
a backlog beyond that is folded by follow-up folds.

Concurrency (invariant 5): a lease on the thread row (fold_lease_token/until) makes folds
single-flight without holding a row lock during the LLM call, and the summary is written
with compare-and-set on `summary_through_seq`, so a duplicate or late fold is a no-op and
turns that arrived meanwhile stay unfolded.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Literal, Protocol

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from memory_core.context import ConversationContext, Exchange
from memory_core.conversation_memory import REDIS_ERRORS, RedisConversationMemory
from memory_core.metrics import FOLD_SECONDS, FOLDS, LLM_TOKENS
from memory_core.models import ConversationThread, ThreadMessage

log = structlog.get_logger(__name__)

ARTIFACT_TAIL_MARKER = "\n\n[Artifacts of the latest folded turns, verbatim]\n"
ARTIFACT_TAIL_TURNS = 3
BACKOFF_BASE_S = 60
BACKOFF_CAP_S = 3600


def backoff_delay(attempt: int) -> int:
    """Delay before retry number `attempt` (1-based): 60, 120, 240, ... capped at 3600 s."""
    return int(min(BACKOFF_BASE_S * 2 ** (max(attempt, 1) - 1), BACKOFF_CAP_S))


class Summarizer(Protocol):
    def summarize(
        self, *, thread_id: str, previous_summary: str | None, exchanges: list[Exchange]
    ) -> SummaryLike: ...


class SummaryLike(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def prompt(self) -> str: ...


FoldStatus = Literal["folded", "noop", "busy", "lost", "failed", "missing"]


@dataclass(frozen=True)
class FoldOutcome:
    status: FoldStatus
    thread_id: str
    through_seq: int | None = None
    folded: int = 0
    attempt: int = 0
    retry_in_s: int | None = None
    error: str | None = None
    prompt: str | None = None
    session_id: str | None = None
    more_pending: bool = False


def strip_artifact_tail(summary: str | None) -> str | None:
    """The LLM-written part of a stored summary (the code-appended tail is re-derived)."""
    if summary is None:
        return None
    return summary.split(ARTIFACT_TAIL_MARKER, 1)[0]


def artifact_tail(turns: list[Exchange]) -> str:
    """Artifact lines of the last folded turns, verbatim: SQL in full, descriptors one-lined."""
    lines: list[str] = []
    for turn in turns[-ARTIFACT_TAIL_TURNS:]:
        for art in turn.artifacts:
            text = art.expanded() if art.kind == "sql" else art.one_line()
            lines.append(f"[#{turn.seq}] {text}")
    return ARTIFACT_TAIL_MARKER + "\n".join(lines) if lines else ""


class Folder:
    """Runs one fold attempt for a thread; the Celery task wraps it with retries."""

    def __init__(self, memory: RedisConversationMemory, summarizer: Summarizer) -> None:
        self.memory = memory
        self.summarizer = summarizer
        self.settings = memory.settings

    def fold(
        self, thread_id: str | uuid.UUID, *, lease_token: uuid.UUID | None = None
    ) -> FoldOutcome:
        """One fold attempt; never raises for LLM trouble (that is a `failed` outcome).

        `lease_token` identifies the attempt: a retry or redelivery of the same job passes the
        same token and so takes over the lease its earlier run left behind (its process died,
        or Postgres went away before the lease could be released) instead of waiting it out.
        """
        started = time.perf_counter()
        outcome = self._fold(uuid.UUID(str(thread_id)), lease_token or uuid.uuid4())
        FOLDS.labels(outcome.status).inc()
        if outcome.status in ("folded", "failed"):
            FOLD_SECONDS.observe(time.perf_counter() - started)
        return outcome

    def _fold(self, tid: uuid.UUID, token: uuid.UUID) -> FoldOutcome:
        with self.memory.session_factory() as session:
            lease = self._take_lease(session, tid, token)
        if isinstance(lease, str):
            return FoldOutcome(lease, str(tid))  # type: ignore[arg-type]
        owner, summary, through, last_seq = lease
        upto = self._fold_upto(through, last_seq)
        if upto is None:
            with self.memory.session_factory() as session:
                self._release(session, tid, token, clear_due=True)
            return FoldOutcome("noop", str(tid), through_seq=through)
        with self.memory.session_factory() as session:
            turns = [
                Exchange.from_row(r) for r in ThreadMessage.between(session, tid, through, upto)
            ]
        try:
            result = self.summarizer.summarize(
                thread_id=str(tid),
                previous_summary=strip_artifact_tail(summary),
                exchanges=turns,
            )
        except Exception as exc:  # any summarizer failure counts as a failed attempt
            return self._failed(tid, token, turns, exc)
        for kind in ("input", "output"):
            LLM_TOKENS.labels(kind).inc(getattr(result, f"{kind}_tokens", None) or 0)
        new_summary = result.text.strip() + artifact_tail(turns)
        with self.memory.session_factory() as session:
            won = self._compare_and_set(
                session,
                tid=tid,
                token=token,
                through=through,
                upto=upto,
                summary=new_summary,
                result=result,
            )
        if not won:
            return FoldOutcome("lost", str(tid), through_seq=through)
        self._refresh_copy(owner, tid, new_summary, upto)
        log.info(
            "memory.folded",
            thread_id=str(tid),
            through_seq=upto,
            folded=len(turns),
            prompt=result.prompt,
        )
        return FoldOutcome(
            "folded",
            str(tid),
            through_seq=upto,
            folded=len(turns),
            prompt=result.prompt,
            session_id=str(turns[-1].session_id),
            more_pending=last_seq - upto > self.memory.compression_threshold,
        )

    def _fold_upto(self, through: int, last_seq: int) -> int | None:
        """Highest seq this fold covers, or None when the thread is not over the threshold."""
        if last_seq - through <= self.memory.compression_threshold:
            return None
        upto = last_seq - self.memory.max_recent_messages
        return min(upto, through + self.memory.max_unfolded_messages)

    def _take_lease(
        self, session: Session, tid: uuid.UUID, token: uuid.UUID
    ) -> tuple[str, str | None, int, int] | str:
        t = ConversationThread
        stmt = (
            update(t)
            .where(
                t.id == tid,
                t.fold_lease_until.is_(None)
                | (t.fold_lease_until < func.now())
                | (t.fold_lease_token == token),
            )
            .values(
                fold_lease_token=token,
                fold_lease_until=func.now()
                + func.make_interval(0, 0, 0, 0, 0, 0, self.settings.memory_fold_lease_s),
            )
            .returning(t.owner_id, t.summary, t.summary_through_seq, t.last_seq)
        )
        row = session.execute(stmt).one_or_none()
        if row is not None:
            return row.owner_id, row.summary, row.summary_through_seq, row.last_seq
        exists = session.scalar(select(t.id).where(t.id == tid))
        return "busy" if exists else "missing"

    def _release(
        self, session: Session, tid: uuid.UUID, token: uuid.UUID, *, clear_due: bool
    ) -> None:
        t = ConversationThread
        values: dict[str, object] = {"fold_lease_token": None, "fold_lease_until": None}
        if clear_due:
            values |= {"fold_due_at": None, "fold_attempts": 0}
        session.execute(update(t).where(t.id == tid, t.fold_lease_token == token).values(**values))

    def _compare_and_set(
        self,
        session: Session,
        *,
        tid: uuid.UUID,
        token: uuid.UUID,
        through: int,
        upto: int,
        summary: str,
        result: SummaryLike,
    ) -> bool:
        t = ConversationThread
        stmt = (
            update(t)
            .where(t.id == tid, t.summary_through_seq == through, t.fold_lease_token == token)
            .values(
                summary=summary,
                summary_through_seq=upto,
                summary_prompt=result.prompt[:200],
                summary_updated_at=func.now(),
                fold_attempts=0,
                fold_due_at=None,
                last_fold_error=None,
                fold_lease_token=None,
                fold_lease_until=None,
            )
            .returning(t.id)
        )
        return session.execute(stmt).first() is not None

    def _failed(
        self, tid: uuid.UUID, token: uuid.UUID, turns: list[Exchange], exc: Exception
    ) -> FoldOutcome:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        t = ConversationThread
        with self.memory.session_factory() as session:
            attempt = session.scalar(
                update(t)
                .where(t.id == tid, t.fold_lease_token == token)
                .values(
                    fold_attempts=t.fold_attempts + 1,
                    last_fold_error=error,
                    fold_lease_token=None,
                    fold_lease_until=None,
                )
                .returning(t.fold_attempts)
            )
            if attempt is None:  # our lease expired and someone else took over
                return FoldOutcome("lost", str(tid), error=error)
            delay = backoff_delay(attempt)
            session.execute(
                update(t)
                .where(t.id == tid)
                .values(fold_due_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, delay))
            )
        log.warning(
            "memory.fold_failed", thread_id=str(tid), attempt=attempt, retry_in_s=delay, error=error
        )
        return FoldOutcome(
            "failed",
            str(tid),
            attempt=attempt,
            retry_in_s=delay,
            error=error,
            session_id=str(turns[-1].session_id) if turns else None,
        )

    def _refresh_copy(self, owner: str, tid: uuid.UUID, summary: str, upto: int) -> None:
        ctx = ConversationContext(thread_id=tid, summary=summary, summary_through_seq=upto)
        try:
            self.memory.copy.merge(owner, ctx, last_seq=upto)
        except REDIS_ERRORS as exc:
            # The copy may have capped off turns this fold just covered: drop it once Redis
            # answers again (the next save would also see the newer cursor and rebuild).
            log.warning("memory.cache_write_failed", thread_id=str(tid), error=str(exc))
            self.memory.mark_copy_behind(tid)
