"""`save_session_to_thread_safe`: the finalize core, shared by in-process agents and workers.

Order of effects (invariant 4, durability first):
  1. one Postgres transaction: upsert the thread (seq claimed under its row lock), insert the
     turn idempotently on session_id, COMMIT;
  2. update the Redis working copy (best effort; rebuilt from Postgres when it is behind);
  3. publish `memory.fold_thread` when this turn took the thread over the threshold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from memory_core.artifacts import derive_artifacts
from memory_core.context import Exchange
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.db import retry_on_disconnect
from memory_core.fold_publisher import publish_fold
from memory_core.metrics import FINALIZE
from memory_core.models import ConversationThread, SeqClaim, ThreadMessage
from memory_core.snapshot import TurnSnapshot

log = structlog.get_logger(__name__)

TITLE_MAX = 500
Status = Literal["saved", "duplicate", "rejected", "failed"]


@dataclass(frozen=True)
class SaveOutcome:
    """What happened to one finalize. `retryable` is True only for infrastructure failures."""

    status: Status
    thread_id: str | None = None
    session_id: str | None = None
    seq: int | None = None
    reason: str | None = None
    cache: str | None = None
    fold_published: bool = False
    retryable: bool = False

    @property
    def ok(self) -> bool:
        return self.status in ("saved", "duplicate")


class _Abort(Exception):
    """Roll the transaction back and report `status` instead."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status: Status = status
        self.reason = reason


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        field = ".".join(str(p) for p in err["loc"]) or "snapshot"
        parts.append(f"{field}: {err['msg']}")
    return "invalid turn snapshot: " + "; ".join(parts)


def parse_snapshot(snapshot: TurnSnapshot | Mapping[str, Any]) -> TurnSnapshot:
    return snapshot if isinstance(snapshot, TurnSnapshot) else TurnSnapshot.model_validate(snapshot)


def save_session_to_thread_safe(
    snapshot: TurnSnapshot | Mapping[str, Any],
    *,
    memory: RedisConversationMemory | None = None,
) -> SaveOutcome:
    """Persist one finished turn; never raises into the agent, returns what happened."""
    try:
        snap = parse_snapshot(snapshot)
    except ValidationError as exc:
        reason = format_validation_error(exc)
        log.warning("memory.finalize_rejected", reason=reason)
        FINALIZE.labels("rejected").inc()
        return SaveOutcome("rejected", reason=reason)
    tid, sid = str(snap.thread_id), str(snap.session_id)
    ids = {"thread_id": tid, "session_id": sid}
    memory = memory or RedisConversationMemory()
    turn = _exchange(snap, seq=0)
    try:
        claim = retry_on_disconnect(lambda: _write_turn(snap, turn, memory))
    except _Abort as abort:
        log.info("memory.finalize_" + abort.status, reason=abort.reason, **ids)
        FINALIZE.labels(abort.status).inc()
        return SaveOutcome(abort.status, tid, sid, reason=abort.reason)
    except (SQLAlchemyError, OSError) as exc:
        log.error("memory.finalize_failed", error=repr(exc), **ids)
        FINALIZE.labels("failed").inc()
        return SaveOutcome("failed", tid, sid, reason=f"postgres: {exc}", retryable=True)
    cache = memory.record_turn(
        snap.owner_id,
        snap.thread_id,
        claim.summary_through_seq,
        turn.model_copy(update={"seq": claim.seq}),
    )
    published = claim.fold_requested and publish_fold(
        snap.thread_id, memory.settings.celery_broker_url
    )
    FINALIZE.labels("saved").inc()
    log.info("memory.finalize_saved", seq=claim.seq, cache=cache, fold_published=published, **ids)
    return SaveOutcome("saved", tid, sid, seq=claim.seq, cache=cache, fold_published=published)


def _write_turn(snap: TurnSnapshot, turn: Exchange, memory: RedisConversationMemory) -> SeqClaim:
    # A Core connection, not an ORM session: the hot path only binds two prebuilt statements.
    with memory.engine.begin() as session:
        claim = ConversationThread.claim_next_seq(
            session,
            thread_id=snap.thread_id,
            owner_id=snap.owner_id,
            agent_type=snap.agent_type,
            title=" ".join(snap.user_query.split())[:TITLE_MAX],
            fold_threshold=memory.compression_threshold,
            republish_grace_s=memory.settings.memory_fold_republish_grace_s,
        )
        if claim is None:
            raise _Abort("rejected", f"thread {snap.thread_id} not found")
        inserted = ThreadMessage.insert_once(
            session,
            thread_id=snap.thread_id,
            session_id=snap.session_id,
            seq=claim.seq,
            user_query=snap.user_query,
            answer=snap.answer,
            artifacts=[a.model_dump(mode="json") for a in turn.artifacts],
            response_payload=snap.response_payload,
            completed_at=snap.completed_at,
        )
        if not inserted:
            # Rolling back also returns the seq we claimed: no gap.
            raise _Abort("duplicate", f"session {snap.session_id} already saved")
    return claim


def _exchange(snap: TurnSnapshot, seq: int) -> Exchange:
    """The memory view of the turn; artifacts are derived here, once."""
    return Exchange(
        seq=seq,
        session_id=snap.session_id,
        user_query=snap.user_query,
        answer=snap.answer,
        artifacts=derive_artifacts(
            snap.sql,
            [v.model_dump() for v in snap.visualizations],
            [d.model_dump() for d in snap.dashboards],
        ),
        completed_at=snap.completed_at,
    )
