"""Folding: the oldest unfolded turns go into the running summary, one thread at a time.

Fold arithmetic (defaults): when a thread has more than `compression_threshold` (20) unfolded
turns, fold all of them except the newest `max_recent_messages` (10): the first fold happens
at turn 21 (turns 1-11), then every 11 turns. A late fold folds whatever is unfolded then,
except the newest 10, at most `max_unfolded_messages` turns per LLM call (a bounded prompt);
a backlog beyond that is folded by follow-up folds.

Token trigger T (`fold_token_trigger`, 6000; 0 = off: the above is all): else, when at least 2
unfolded turns have estimated sizes summing to more than T, fold all but the newest turns that
sum to at most T // 2 (the newest always stays); one turn alone is never due (tokens.py).

Concurrency (guarantee 5, docs/ARCHITECTURE.md): a lease on the thread row
(fold_lease_token/until) makes folds single-flight without holding a row lock during the LLM
call, and the summary is written with compare-and-set on `summary_through_seq`, so a duplicate
or late fold is a no-op and turns that arrived meanwhile stay unfolded.

Failures: a summarizer error is a failed attempt (counted on the row, backoff, an event from
the task). After `MEMORY_FOLD_MAX_LLM_ATTEMPTS` failed attempts, or at once for an error no
retry can fix (the provider refused the request as such), the fold uses the LLM-free summary
instead and says so (`fallback`). Any other unexpected error after the lease is taken is a
failed attempt too; only Postgres being unreachable propagates (the task retries the job,
whose lease token lets it take its own lease back).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.copy.context import Exchange
from memory_core.fold.carry_forward import CarriedForward, carry_forward
from memory_core.fold.llm_free import LLM_FREE_LABEL, LLM_FREE_TARGET_TOKENS, llm_free_fold
from memory_core.fold.outcome import FoldOutcome, Summarizer, backoff_delay
from memory_core.fold.statements import lease_statement, store_statement
from memory_core.fold.summarizer import SummarizationError, SummaryResult, storable
from memory_core.fold.summary_tail import (
    ARTIFACT_TAIL_MARKER,
    ARTIFACT_TAIL_TURNS,
    artifact_tail,
    fit_lines,
    stored_summary_bound,
    strip_artifact_tail,
    with_tail,
)
from memory_core.fold.tokens import token_due, token_upto
from memory_core.io.db import describe_db_error, retry_on_disconnect
from memory_core.io.fast_write import execute_autocommit
from memory_core.logs import describe_error, get_logger
from memory_core.metrics import FOLD_FALLBACKS, FOLD_SECONDS, FOLDS, INSTRUCTIONS, LLM_TOKENS
from memory_core.models import ConversationThread, ThreadMessage
from memory_core.tokens import count_tokens, turn_size

log = get_logger(__name__)

__all__ = [
    "ARTIFACT_TAIL_MARKER",
    "ARTIFACT_TAIL_TURNS",
    "FoldOutcome",
    "Folder",
    "artifact_tail",
    "backoff_delay",
    "stored_summary_bound",
    "strip_artifact_tail",
]

# Errors meaning "Postgres is unreachable": the task retries the job; nothing is counted.
POSTGRES_DOWN = (OperationalError, InterfaceError)


@dataclass(frozen=True)
class _Lease:
    owner: str
    summary: str | None
    through: int
    last_seq: int
    attempts: int
    unfolded_tokens: int


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
        tid, token = uuid.UUID(str(thread_id)), lease_token or uuid.uuid4()
        # A pooled connection killed by a Postgres restart fails once: run the attempt again
        # on a fresh one (same token: it takes its own lease back).
        outcome = retry_on_disconnect(lambda: self._fold(tid, token))
        FOLDS.labels(outcome.status).inc()
        if outcome.status in ("folded", "failed"):
            FOLD_SECONDS.observe(time.perf_counter() - started)
        return outcome

    def _fold(self, tid: uuid.UUID, token: uuid.UUID) -> FoldOutcome:
        # A fold-only worker never reads or saves: it drops the copies it marked here.
        self.memory.drop_copies_behind()
        lease = self._take_lease(tid, token)
        if isinstance(lease, str):
            return FoldOutcome(lease, str(tid))  # type: ignore[arg-type]
        upto = self._fold_upto(lease.through, lease.last_seq)  # the turn-count rule wins
        plan = token_upto(self.memory, tid, token, lease)  # also sets the counter right
        upto = plan.upto if upto is None else upto
        if upto is None:
            with self.memory.session_factory() as session:
                again = self._release(session, tid, token, clear_due=True)
            return FoldOutcome("noop", str(tid), through_seq=lease.through, more_pending=again)
        turns: list[Exchange] = []
        try:
            covered = plan.covered(upto)  # the rows the token trigger read: not read again
            if covered is None:
                with self.memory.session_factory() as session:
                    rows = ThreadMessage.between(session, tid, lease.through, upto)
                    covered = [Exchange.from_row(r) for r in rows], None
            turns, folded = covered
            return self._summarize_and_store(tid, token, lease, upto, turns, folded=folded)
        except POSTGRES_DOWN:
            raise
        except Exception as exc:  # never a silent drop: a failed attempt, with its event
            return self._failed(tid, token, turns, exc)

    def _summarize_and_store(
        self,
        tid: uuid.UUID,
        token: uuid.UUID,
        lease: _Lease,
        upto: int,
        turns: list[Exchange],
        *,
        folded: int | None,
    ) -> FoldOutcome:
        previous = strip_artifact_tail(lease.summary)
        fallback = None
        try:
            result: Any = self.summarizer.summarize(
                thread_id=str(tid), previous_summary=previous, exchanges=turns
            )
        except Exception as exc:  # any summarizer failure counts as a failed attempt...
            fallback = self._fallback_reason(exc, lease.attempts + 1)
            if fallback is None:
                return self._failed(tid, token, turns, exc)
            # ...until it is clear that retrying the LLM cannot help.
            result = self._llm_free(previous, turns)
            FOLD_FALLBACKS.inc()
        carried = self._carried(previous, turns, result)
        new_summary = self._stored_summary(carried.text, turns)
        if folded is None:  # read without their sizes; these are the turns folded
            on = self.memory.fold_token_trigger > 0
            folded = sum(turn_size(t) for t in turns) if on else 0
        won, again = self._compare_and_set(
            tid=tid,
            token=token,
            through=lease.through,
            upto=upto,
            summary=new_summary,
            prompt=result.prompt,
            folded=folded,
        )
        if not won:
            return FoldOutcome("lost", str(tid), through_seq=lease.through)
        self.memory.refresh_summary(lease.owner, tid, new_summary, upto)
        return self._folded(
            tid, upto, turns, result.prompt, carried, fallback=fallback, again=again
        )

    def _carried(self, previous: str | None, turns: list[Exchange], result: Any) -> CarriedForward:
        """The standing instructions the new summary must keep (counted), and the token counts.
        Restored ones get their room within the bound first: the rest is cut at line ends."""
        for kind in ("input", "output"):
            LLM_TOKENS.labels(kind).inc(getattr(result, f"{kind}_tokens", None) or 0)
        if result.prompt == LLM_FREE_LABEL:  # the LLM-free fold carries them by construction
            return CarriedForward(result.text)
        limit = self.settings.memory_summary_max_tokens
        carried = carry_forward(previous, turns, storable(result.text).strip(), limit)
        INSTRUCTIONS.labels("restored").inc(carried.restored)
        INSTRUCTIONS.labels("superseded_dropped").inc(carried.superseded_dropped)
        return carried

    @staticmethod
    def _folded(
        tid: uuid.UUID,
        upto: int,
        turns: list[Exchange],
        prompt: str,
        carried: CarriedForward,
        *,
        fallback: str | None,
        again: bool,
    ) -> FoldOutcome:
        log.info(
            "memory.folded",
            thread_id=str(tid),
            through_seq=upto,
            folded=len(turns),
            prompt=prompt,
            fallback=fallback,
            instructions_restored=carried.restored,
            superseded_dropped=carried.superseded_dropped,
        )
        return FoldOutcome(
            "folded",
            str(tid),
            through_seq=upto,
            folded=len(turns),
            prompt=prompt,
            session_id=str(turns[-1].session_id),
            more_pending=again,
            fallback=fallback,
            instructions_restored=carried.restored,
            superseded_dropped=carried.superseded_dropped,
        )

    def _fallback_reason(self, exc: Exception, attempt: int) -> str | None:
        """Why this attempt uses the LLM-free summary, or None to count a failed attempt."""
        error = _describe(exc)
        if not getattr(exc, "retryable", True):
            return f"not retryable: {error}"
        limit = self.settings.memory_fold_max_llm_attempts
        if attempt >= limit:
            return f"{attempt} failed attempts, last: {error}"
        return None

    def _llm_free(self, previous: str | None, turns: list[Exchange]) -> SummaryResult:
        bound = min(self.settings.memory_summary_max_tokens, LLM_FREE_TARGET_TOKENS)
        text = llm_free_fold(previous, turns, bound)
        return SummaryResult(text, LLM_FREE_LABEL, None, None, None)

    def _stored_summary(self, text: str, turns: list[Exchange]) -> str:
        """What is stored: the summarizer's text (storable, within its bound) + the tail."""
        limit = self.settings.memory_summary_max_tokens
        clean = storable(text).strip()
        if count_tokens(clean) > limit:  # a summarizer that ignored its bound: whole lines
            clean = fit_lines(clean.splitlines(), limit)
        return with_tail(clean, turns, limit)

    def _fold_upto(self, through: int, last_seq: int) -> int | None:
        """Highest seq this fold covers, or None when the thread is not over the threshold."""
        if last_seq - through <= self.memory.compression_threshold:
            return None
        upto = last_seq - self.memory.max_recent_messages
        return min(upto, through + self.memory.max_unfolded_messages)

    def _take_lease(self, tid: uuid.UUID, token: uuid.UUID) -> _Lease | str:
        """Our lease (one autocommitted UPDATE), or why not: "busy" or "missing"."""
        params = {"tid": tid, "token": token, "lease_s": self.settings.memory_fold_lease_s}
        rows = execute_autocommit(self.memory.engine, lease_statement(), params)
        if rows:
            return _Lease(*rows[0])
        with self.memory.session_factory() as session:
            t = ConversationThread
            exists = session.scalar(select(t.id).where(t.id == tid))
        return "busy" if exists else "missing"

    def _due_again(self, through: Any, tokens: Any = None) -> Any:
        """`fold_due_at` as a fold leaves the row: now() if the thread is (still, or again) over
        the threshold or the token trigger, else NULL. Evaluated under the row lock of the
        releasing UPDATE, which a finalize's claim also takes: a turn that arrived during the
        fold saw a fold pending and published nothing, so the fold that ends must ask for the
        next one itself (else a thread's last turn stays unfolded until a new turn comes)."""
        t = ConversationThread
        over = t.last_seq - through > self.memory.compression_threshold
        tokens = t.unfolded_tokens if tokens is None else tokens  # the counter as UPDATEd
        over = over | token_due(tokens, t.last_seq - through, self.memory.fold_token_trigger)
        return case((over, func.now()), else_=None)

    def _release(
        self, session: Session, tid: uuid.UUID, token: uuid.UUID, *, clear_due: bool
    ) -> bool:
        """Drop our lease; with `clear_due`, end the request too. True if another fold is due."""
        t = ConversationThread
        values: dict[str, object] = {"fold_lease_token": None, "fold_lease_until": None}
        if clear_due:
            values |= {"fold_due_at": self._due_again(t.summary_through_seq), "fold_attempts": 0}
        stmt = update(t).where(t.id == tid, t.fold_lease_token == token).values(**values)
        again = session.execute(stmt.returning(t.fold_due_at.is_not(None))).scalar()
        return bool(clear_due and again)

    def _compare_and_set(
        self,
        *,
        tid: uuid.UUID,
        token: uuid.UUID,
        through: int,
        upto: int,
        summary: str,
        prompt: str,
        folded: int,
    ) -> tuple[bool, bool]:
        """Store the summary if our lease still holds (one autocommitted UPDATE,
        fold_statements.store_statement): (won, another fold is due now). `folded`: the
        sizes of the folded turns, taken off the token counter when its trigger is on."""
        params = {
            "tid": tid,
            "token": token,
            "through": through,
            "upto": upto,
            "summary": summary,
            "prompt": prompt[:200],
            "folded": folded,
            "threshold": self.memory.compression_threshold,
            "trigger": self.memory.fold_token_trigger,
        }
        rows = execute_autocommit(self.memory.engine, store_statement(), params)
        return (bool(rows), bool(rows and rows[0].again))

    def _failed(
        self, tid: uuid.UUID, token: uuid.UUID, turns: list[Exchange], exc: Exception
    ) -> FoldOutcome:
        error = _describe(exc)
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
            s = self.settings
            delay = backoff_delay(
                attempt, s.memory_fold_backoff_base_s, s.memory_fold_backoff_cap_s
            )
            session.execute(
                update(t)
                .where(t.id == tid)
                .values(fold_due_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, delay))
            )
        log.warning(
            "memory.fold_failed",
            thread_id=str(tid),
            attempt=attempt,
            retry_in_s=delay,
            error=error,
        )
        return FoldOutcome(
            "failed",
            str(tid),
            attempt=attempt,
            retry_in_s=delay,
            error=error,
            session_id=str(turns[-1].session_id) if turns else None,
        )


def _describe(exc: BaseException) -> str:
    """A failed attempt's error, for the row, the log and the event: never content."""
    if isinstance(exc, SummarizationError):
        return f"SummarizationError: {exc}"
    if type(exc).__module__.startswith(("sqlalchemy", "psycopg2")):
        return describe_db_error(exc)
    return describe_error(exc)
