"""ConversationThread and ThreadMessage: Redash-style fat models.

Finders are short classmethods taking a `Session`. Methods may add/flush/execute but never
commit: the caller owns the transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    bindparam,
    func,
    select,
    text,
    true,
    tuple_,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID, insert
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapped, Session, mapped_column

from memory_core.io.db import Base


def no_live_lease(lease_until: Any) -> Any:
    """No fold holds the thread: no lease, or an expired one (`conversation_threads.
    fold_lease_until`, as a Core column or the mapped attribute). The lease, the finalize's
    redelivery and the sweep of lost folds must agree on it."""
    return lease_until.is_(None) | (lease_until < func.now())


class ConversationThread(Base):
    """One row per thread: owner, agent type, title, archive flags and the running summary."""

    __tablename__ = "conversation_threads"
    __table_args__ = (
        CheckConstraint("agent_type IN ('chat', 'copilot')", name="agent_type"),
        CheckConstraint(
            "summary_through_seq >= 0 AND summary_through_seq <= last_seq", name="summary_cursor"
        ),
        Index(
            "ix_conversation_threads_owner_history", "owner_id", "is_archived", "updated_at", "id"
        ),
        # Threads with a fold due (requested, running late or waiting for a retry): what the
        # fold-lag gauges count, without scanning every thread.
        Index(
            "ix_conversation_threads_fold_due",
            "fold_due_at",
            postgresql_where=text("fold_due_at IS NOT NULL"),
        ),
        Index("ix_conversation_threads_updated_at", "updated_at"),  # retention
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(255))
    agent_type: Mapped[str] = mapped_column(String(16))
    title: Mapped[str] = mapped_column(Text)
    is_archived: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    archived_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Running LLM summary: covers every turn with seq <= summary_through_seq.
    summary: Mapped[str | None] = mapped_column(Text)
    summary_through_seq: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    summary_prompt: Mapped[str | None] = mapped_column(String(200))
    summary_updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Highest seq handed out; bumped under the row lock so seq has no gaps.
    last_seq: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # Fold bookkeeping: failed attempts, when the next attempt is due, and the single-flight lease.
    fold_attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    fold_due_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    fold_lease_token: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    fold_lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_fold_error: Mapped[str | None] = mapped_column(Text)
    # Estimated tokens (tokens.turn_size) of the unfolded turns: the fold token trigger. A claim
    # adds to at most claim.UNFOLDED_TOKENS_CAP (a turn is < 2M): a finalize never overflows int4.
    unfolded_tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    @classmethod
    def get_owned(cls, session: Session, thread_id: uuid.UUID, owner_id: str) -> Any:
        stmt = select(cls).where(cls.id == thread_id, cls.owner_id == owner_id)
        return session.scalars(stmt).one_or_none()

    @classmethod
    def history(
        cls,
        session: Session,
        owner_id: str,
        *,
        limit: int = 20,
        before: tuple[datetime, uuid.UUID] | None = None,
        include_archived: bool = False,
    ) -> list[ConversationThread]:
        """A user's threads, most recently active first; keyset-paginated by `before`."""
        stmt = select(cls).where(cls.owner_id == owner_id)
        if not include_archived:
            stmt = stmt.where(cls.is_archived.is_(False))
        if before is not None:
            stmt = stmt.where(tuple_(cls.updated_at, cls.id) < tuple_(*before))
        stmt = stmt.order_by(cls.updated_at.desc(), cls.id.desc()).limit(limit)
        return list(session.scalars(stmt))

    def set_archived(self, archived: bool) -> None:
        self.is_archived = archived
        self.archived_at = func.now() if archived else None

    @classmethod
    def rehydrate(
        cls, session: Session | Connection, thread_id: uuid.UUID, owner_id: str, cap: int
    ) -> tuple[Any, list[Any]] | None:
        """Summary + the newest `cap` unfolded turns in one indexed, owner-checked query."""
        rows = session.execute(cls.rehydrate_statement(thread_id, owner_id, cap)).all()
        return cls.rehydrated(rows)

    @classmethod
    def rehydrate_statement(cls, thread_id: uuid.UUID, owner_id: str, cap: int) -> Any:
        """The query of `rehydrate`: reads via the (thread_id, seq) unique index backwards
        from the end, so the cost does not grow with the length of the thread's history."""
        m = cast(Table, ThreadMessage.__table__)
        t = cast(Table, cls.__table__)
        recent = (
            select(
                m.c.seq, m.c.session_id, m.c.user_query, m.c.answer, m.c.artifacts, m.c.completed_at
            )
            .where(m.c.thread_id == t.c.id, m.c.seq > t.c.summary_through_seq)
            .order_by(m.c.seq.desc())
            .limit(cap)
            .lateral("recent")
        )
        return (
            select(t.c.summary, t.c.summary_through_seq, t.c.last_seq, recent)
            .select_from(t.outerjoin(recent, true()))
            .where(t.c.id == thread_id, t.c.owner_id == owner_id)
        )

    @staticmethod
    def rehydrated(rows: Sequence[Any]) -> tuple[Any, list[Any]] | None:
        """`rehydrate_statement`'s rows as (thread head, turns oldest first); None: no thread."""
        if not rows:
            return None
        turns = sorted((r for r in rows if r.seq is not None), key=lambda r: r.seq)
        return rows[0], turns


class ThreadTombstone(Base):
    """A deleted thread: its id and when, nothing else (no owner, no content).

    A finalize for this id is rejected (`deleted`); a trigger (migration 3d9a6c1e5b27) refuses
    to re-create the thread row even for a finalize that was blocked while it was deleted.
    """

    __tablename__ = "thread_tombstones"

    thread_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    deleted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class PendingTracePurge(Base):
    """A deleted thread whose Langfuse traces may still exist (memory_core/lifecycle/threads.py)."""

    __tablename__ = "trace_purges"

    thread_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    requested_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)


class MemorySettingsSeen(Base):
    """Memory settings fingerprints recently used by some process
    (memory_core/copy/settings_check.py)."""

    __tablename__ = "memory_settings_seen"

    fingerprint: Mapped[str] = mapped_column(String(500), primary_key=True)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


@cache
def _insert_message_statement() -> Any:
    t = cast(Table, ThreadMessage.__table__)
    cols = (
        "thread_id",
        "session_id",
        "seq",
        "user_query",
        "answer",
        "artifacts",
        "response_payload",
        "completed_at",
    )
    return (
        insert(t)
        .values({c: bindparam(c, type_=t.c[c].type) for c in cols})
        .on_conflict_do_nothing(index_elements=[t.c.session_id])
        .returning(t.c.id)
    )


@cache
def _stored_turn_statement() -> Any:
    t = cast(Table, ThreadMessage.__table__)
    cols = ("thread_id", "seq", "session_id", "user_query", "answer", "artifacts", "completed_at")
    return select(*(t.c[c] for c in cols)).where(
        t.c.session_id == bindparam("sid", type_=t.c.session_id.type)
    )


@cache
def _stored_seq_statement() -> Any:
    t = cast(Table, ThreadMessage.__table__)
    return select(t.c.seq).where(
        t.c.session_id == bindparam("sid", type_=t.c.session_id.type),
        t.c.thread_id == bindparam("tid", type_=t.c.thread_id.type),
    )


class ThreadMessage(Base):
    """One user-query -> answer turn; `session_id` makes finalize idempotent."""

    __tablename__ = "thread_messages"
    __table_args__ = (
        UniqueConstraint("thread_id", "seq", name="uq_thread_messages_thread_id_seq"),
        CheckConstraint("seq >= 1", name="seq_positive"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("conversation_threads.id", ondelete="CASCADE")
    )
    session_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), unique=True)
    seq: Mapped[int] = mapped_column(Integer)
    user_query: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text, server_default=text("''"))
    # Derived once at finalize (memory_core.write.artifacts); read back as stored, never re-derived.
    artifacts: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    response_payload: Mapped[dict[str, Any]] = mapped_column(
        JSONB, server_default=text("'{}'::jsonb")
    )
    completed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    @staticmethod
    def insert_statement() -> Any:
        """Insert a turn unless its session_id is stored: returns a row only when inserted."""
        return _insert_message_statement()

    @staticmethod
    def stored_turn_statement() -> Any:
        """The turn stored for session `sid` (thread_id, seq and what memory reads of it)."""
        return _stored_turn_statement()

    @classmethod
    def insert_once(cls, session: Session | Connection, **values: Any) -> bool:
        """Insert the turn unless its session_id is already stored; True when inserted."""
        return session.execute(_insert_message_statement(), values).first() is not None

    @classmethod
    def stored_turn(cls, session: Session | Connection, session_id: uuid.UUID) -> Any:
        """The turn stored for `session_id` (thread_id, seq and what memory reads of it)."""
        return session.execute(_stored_turn_statement(), {"sid": session_id}).one()

    @staticmethod
    def stored_seq_statement() -> Any:
        """The seq of the turn stored for session `sid` in thread `tid` (no row: not stored)."""
        return _stored_seq_statement()

    @classmethod
    def by_session(cls, session: Session, session_id: uuid.UUID) -> ThreadMessage | None:
        return session.scalars(select(cls).where(cls.session_id == session_id)).one_or_none()

    @classmethod
    def transcript(
        cls,
        session: Session,
        thread_id: uuid.UUID,
        owner_id: str,
        *,
        after_seq: int = 0,
        limit: int = 50,
    ) -> list[ThreadMessage]:
        """A page of the transcript in order (owner-checked through the thread row)."""
        stmt = (
            select(cls)
            .join(ConversationThread, ConversationThread.id == cls.thread_id)
            .where(
                cls.thread_id == thread_id,
                ConversationThread.owner_id == owner_id,
                cls.seq > after_seq,
            )
            .order_by(cls.seq)
            .limit(limit)
        )
        return list(session.scalars(stmt))

    @classmethod
    def between(
        cls, session: Session, thread_id: uuid.UUID, after_seq: int, through_seq: int
    ) -> list[ThreadMessage]:
        """Turns after_seq < seq <= through_seq in order (what a fold reads)."""
        stmt = (
            select(cls)
            .where(cls.thread_id == thread_id, cls.seq > after_seq, cls.seq <= through_seq)
            .order_by(cls.seq)
        )
        return list(session.scalars(stmt))
