"""`save_session_to_thread_safe`: the finalize core, shared by in-process agents and workers.

Order of effects (durability first, docs/RELIABILITY.md):
  1. one Postgres statement that commits on its own (claim.finalize_statement): upsert the
     thread (seq claimed under its row lock) and insert the turn, idempotent on session_id
     (a stored session fails the statement: nothing written, no seq lost);
  2. update the Redis working copy (best effort; rebuilt from Postgres when it is behind);
  3. publish `memory.fold_thread` when this turn took the thread over the threshold (its
     unfolded turns, or their estimated tokens: the fold token trigger).

An asyncio save cancelled at any await (a client disconnect, a request timeout) drops the
thread's copy before its caller gets the `CancelledError`: committed or not, no read serves a
copy without the turn.

It never raises: every outcome is a `SaveOutcome`. Before the COMMIT a failure is `failed`
(retryable, nothing written) or `rejected` (bad input, never retryable); after it, whatever
Redis or the broker do, the outcome is `saved` or `duplicate`. A redelivered turn
(`duplicate`) still makes sure the working copy holds it and publishes a fold its thread has
due that nobody holds, since the first delivery may have died between its COMMIT and its cache
write or its publish. Reasons and log records carry ids and error
classes, never snapshot content.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.copy.context import Exchange
from memory_core.fold.publisher import publish_fold
from memory_core.io.async_driver import run_async
from memory_core.io.cancellation import Cancelled
from memory_core.io.db import describe_db_error, sqlstate
from memory_core.io.steps import (
    Call,
    Read,
    Steps,
    Write,
    retry_on_disconnect,
)
from memory_core.io.sync_driver import run_sync
from memory_core.logs import describe_error, get_logger
from memory_core.metrics import FINALIZE
from memory_core.settings import SettingsError
from memory_core.tokens import turn_size
from memory_core.write.artifacts import artifacts_json, derive_artifacts
from memory_core.write.claim import (
    SESSION_CONSTRAINT,
    SeqClaim,
    claim_params,
    finalize_statement,
    stored_turn_statement,
)
from memory_core.write.snapshot import (
    DashboardIn,
    SnapshotTooLarge,
    StandingInstructionIn,
    TurnSnapshot,
    VisualizationIn,
    WidgetIn,
    WidgetVisualizationIn,
    check_snapshot_size,
)

log = get_logger(__name__)

TITLE_MAX = 500
# The reason of a finalize for a deleted thread (a tombstone; memory_core/lifecycle/threads.py).
REASON_DELETED = "deleted"
# Raised by the trigger that refuses to re-create a deleted thread (migration 3d9a6c1e5b27).
THREAD_DELETED_SQLSTATE = "AM001"
UNIQUE_VIOLATION = "23505"
Status = Literal["saved", "duplicate", "rejected", "failed", "enqueued"]


@dataclass(frozen=True)
class SaveOutcome:
    """What happened to one finalize. `retryable` is True only for infrastructure failures.

    `enqueued` (only from `enqueue_turn`): the job is on the broker, `task_id` names it; pass
    the outcome to `get_context(wait_for=...)` to read the thread with that turn.
    """

    status: Status
    thread_id: str | None = None
    session_id: str | None = None
    seq: int | None = None
    reason: str | None = None
    cache: str | None = None
    fold_published: bool = False
    retryable: bool = False
    task_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("saved", "duplicate", "enqueued")


class _Abort(Exception):
    """Roll the transaction back and report `status` instead."""

    def __init__(self, status: Status, reason: str, stored: Any = None) -> None:
        super().__init__(reason)
        self.status: Status = status
        self.reason = reason
        self.stored = stored  # for a duplicate: the stored row and the summary cursor


_FIELD_NAMES = frozenset(
    name
    for model in (
        TurnSnapshot,
        VisualizationIn,
        DashboardIn,
        WidgetIn,
        WidgetVisualizationIn,
        StandingInstructionIn,
    )
    for name in model.model_fields
)


# An unknown top-level key is named only if it looks like a field name (a typo such as
# `sesion_id`); anything else may be content and is not repeated.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


def format_validation_error(exc: ValidationError) -> str:
    """Which fields are wrong and why; never the values, nor keys that are not ours."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = [str(p) for p in err["loc"] if isinstance(p, int) or p in _FIELD_NAMES]
        field = ".".join(loc) or "snapshot"
        if err["type"] == "extra_forbidden":
            key = str(err["loc"][-1]) if len(err["loc"]) == 1 else ""
            name = key if _IDENTIFIER.fullmatch(key) else field  # nested: where it is
            parts.append(f"{name}: unknown field (not part of a turn snapshot)")
        else:
            parts.append(f"{field}: {err['msg'][:300]}")
    return "invalid turn snapshot: " + "; ".join(dict.fromkeys(parts))


def parse_snapshot(snapshot: TurnSnapshot | Mapping[str, Any]) -> TurnSnapshot:
    if isinstance(snapshot, TurnSnapshot):
        return snapshot
    check_snapshot_size(snapshot)  # before deep validation: refuse huge input cheaply
    return TurnSnapshot.model_validate(snapshot)


def save_session_to_thread_safe(
    snapshot: TurnSnapshot | Mapping[str, Any],
    *,
    memory: RedisConversationMemory | None = None,
) -> SaveOutcome:
    """Persist one finished turn; never raises into the agent, returns what happened."""
    ready = _prepare(snapshot, memory)
    if isinstance(ready, SaveOutcome):
        return ready
    snap, memory = ready
    return run_sync(save_steps(snap, memory), memory.sync_io())


async def asave_session_to_thread_safe(
    snapshot: TurnSnapshot | Mapping[str, Any],
    *,
    memory: RedisConversationMemory | None = None,
) -> SaveOutcome:
    """`save_session_to_thread_safe` on asyncio clients: same steps, same `SaveOutcome`s."""
    ready = _prepare(snapshot, memory)
    if isinstance(ready, SaveOutcome):
        return ready
    snap, memory = ready
    try:
        io = memory.async_io()
    except Exception as exc:  # e.g. a DATABASE_URL the asyncio driver cannot take
        return _failed(exc, str(snap.thread_id), str(snap.session_id))
    return await run_async(save_steps(snap, memory), io)


def reject_or_parse(snapshot: TurnSnapshot | Mapping[str, Any]) -> TurnSnapshot | SaveOutcome:
    """The validated snapshot, or the `rejected` outcome (logged, counted) for bad input."""
    try:
        return parse_snapshot(snapshot)
    except (ValidationError, SnapshotTooLarge) as exc:
        reason = format_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
        log.warning("memory.finalize_rejected", reason=reason)
        FINALIZE.labels("rejected").inc()
        return SaveOutcome("rejected", reason=reason)


def _prepare(
    snapshot: TurnSnapshot | Mapping[str, Any], memory: RedisConversationMemory | None
) -> tuple[TurnSnapshot, RedisConversationMemory] | SaveOutcome:
    snap = reject_or_parse(snapshot)
    if isinstance(snap, SaveOutcome):
        return snap
    try:
        return snap, memory or RedisConversationMemory()
    except Exception as exc:  # settings that cannot work: nothing was written
        return _failed(exc, str(snap.thread_id), str(snap.session_id))


def save_steps(snap: TurnSnapshot, memory: RedisConversationMemory) -> Steps[SaveOutcome]:
    """The finalize, as steps (memory_core/io/steps.py) both drivers perform."""
    try:
        return (yield from _save_steps(snap, memory))
    except Cancelled:
        # The asyncio caller went away at some await: the turn may be committed (its reply
        # was perhaps in flight) while the copy lacks it. Drop the copy before the caller
        # hears of the cancellation, so every later read, in any process, rebuilds it.
        yield from memory.drop_copy_steps(snap.thread_id)
        raise


def _save_steps(snap: TurnSnapshot, memory: RedisConversationMemory) -> Steps[SaveOutcome]:
    tid, sid = str(snap.thread_id), str(snap.session_id)
    try:
        turn = _exchange(snap, seq=0)
        claim = yield from retry_on_disconnect(lambda: _write_turn(snap, turn, memory))
    except _Abort as abort:
        if abort.status == "duplicate":
            return (yield from _duplicate(snap, abort.stored, memory))
        log.info(
            "memory.finalize_" + abort.status,
            reason=abort.reason,
            thread_id=tid,
            session_id=sid,
        )
        FINALIZE.labels(abort.status).inc()
        return SaveOutcome(abort.status, tid, sid, reason=abort.reason)
    except Exception as exc:  # nothing was committed: the agent or Celery retries
        return _failed(exc, tid, sid)
    # Committed: from here on nothing raises, whatever Redis or the broker do.
    cache = yield from memory.record_turn_steps(
        snap.owner_id,
        snap.thread_id,
        claim.summary_through_seq,
        turn.model_copy(update={"seq": claim.seq}),
    )
    published = claim.fold_requested and (
        yield Call(publish_fold, (snap.thread_id, memory.settings.celery_broker_url))
    )
    FINALIZE.labels("saved").inc()
    # DEBUG: one record per saved turn is the hot path's costliest line when logging is on
    # (a JSON render per turn); memory_finalize_total{status="saved"} counts them anyway.
    log.debug(
        "memory.finalize_saved",
        thread_id=tid,
        session_id=sid,
        seq=claim.seq,
        cache=cache,
        fold_published=published,
    )
    return SaveOutcome("saved", tid, sid, seq=claim.seq, cache=cache, fold_published=published)


def _failed(exc: Exception, tid: str, sid: str) -> SaveOutcome:
    kind = "postgres" if isinstance(exc, SQLAlchemyError | OSError) else "error"
    error = describe_db_error(exc) if kind == "postgres" else describe_error(exc)
    if isinstance(exc, SettingsError):  # its message names variables, never content
        kind, error = "settings", str(exc)
    log.error("memory.finalize_failed", error=error, thread_id=tid, session_id=sid)
    FINALIZE.labels("failed").inc()
    return SaveOutcome("failed", tid, sid, reason=f"{kind}: {error}", retryable=True)


def _write_turn(
    snap: TurnSnapshot, turn: Exchange, memory: RedisConversationMemory
) -> Steps[SeqClaim]:
    """The claim and the insert: one prebuilt statement that commits on its own (claim.py);
    a redelivered turn (its session_id stored) undoes it and reads the stored turn back."""
    try:
        row = yield Write(
            finalize_statement(),
            {
                **claim_params(
                    thread_id=snap.thread_id,
                    owner_id=snap.owner_id,
                    agent_type=snap.agent_type,
                    title=" ".join(snap.user_query.split())[:TITLE_MAX],
                    fold_threshold=memory.compression_threshold,
                    republish_grace_s=memory.settings.memory_fold_republish_grace_s,
                    turn_tokens=turn_size(turn) if memory.fold_token_trigger > 0 else 0,
                    token_trigger=memory.fold_token_trigger,
                ),
                "thread_id": snap.thread_id,
                "session_id": snap.session_id,
                "user_query": snap.user_query,
                "answer": snap.answer,
                "artifacts": artifacts_json(turn.artifacts),
                "response_payload": snap.response_payload,
                "completed_at": snap.completed_at,
            },
            "one_or_none",
        )
    except DBAPIError as exc:
        state, constraint = sqlstate(exc.orig), _constraint(exc.orig)
        if state == THREAD_DELETED_SQLSTATE:  # the thread was deleted (even while we waited)
            raise _Abort("rejected", REASON_DELETED) from None
        if state != UNIQUE_VIOLATION or constraint != SESSION_CONSTRAINT:
            raise
        # Nothing of this statement was written (no seq lost); the turn is stored already.
        stored = yield Read(stored_turn_statement(), {"sid": snap.session_id}, "one")
        if stored.thread_id != snap.thread_id:
            raise _Abort(
                "rejected", f"session {snap.session_id} is already a turn of another thread"
            ) from None
        raise _Abort("duplicate", "", (stored, stored.summary_through_seq)) from None
    if row is None:
        raise _Abort("rejected", f"thread {snap.thread_id} not found")
    return SeqClaim(row.last_seq, row.summary_through_seq, bool(row.fold_requested))


def _constraint(orig: object) -> str | None:
    diag = getattr(orig, "diag", None)
    return getattr(diag, "constraint_name", None)


def _duplicate(
    snap: TurnSnapshot, stored: tuple[Any, int], memory: RedisConversationMemory
) -> Steps[SaveOutcome]:
    """An already-stored turn: make sure the copy holds it and that a fold its thread has due
    is published (its first delivery may have died between COMMIT and the cache write or the
    publish), from what is stored, never from the redelivery."""
    row, through = stored
    tid, sid = str(snap.thread_id), str(snap.session_id)
    cache = yield from memory.record_turn_steps(
        snap.owner_id, snap.thread_id, through, Exchange.from_row(row)
    )
    published = bool(row.fold_unclaimed) and (
        yield Call(publish_fold, (snap.thread_id, memory.settings.celery_broker_url))
    )
    FINALIZE.labels("duplicate").inc()
    log.info(
        "memory.finalize_duplicate",
        thread_id=tid,
        session_id=sid,
        seq=row.seq,
        cache=cache,
        fold_published=published,
    )
    return SaveOutcome(
        "duplicate",
        tid,
        sid,
        seq=row.seq,
        reason=f"session {sid} already saved",
        cache=cache,
        fold_published=published,
    )


def _exchange(snap: TurnSnapshot, seq: int) -> Exchange:
    """The memory view of the turn; artifacts are derived here, once."""
    return Exchange(
        seq=seq,
        session_id=snap.session_id,
        user_query=snap.user_query,
        answer=snap.answer,
        artifacts=derive_artifacts(
            snap.sql,
            [dict(v) for v in snap.visualizations],  # shallow: options are read, not copied
            [d.model_dump() for d in snap.dashboards],
            None
            if snap.standing_instructions is None
            else [(d.subject, d.text) for d in snap.standing_instructions],
        ),
        completed_at=snap.completed_at,
    )
