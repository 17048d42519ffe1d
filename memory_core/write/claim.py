"""The finalize's claim: one upsert that creates the thread or bumps its seq, under its row lock.

It also counts the turn's estimated tokens (the fold token trigger, memory_core/fold/tokens.py) and
marks a fold as requested when this turn takes the thread over the turn threshold or the token
trigger and no fold is pending (or the pending one is overdue: its message was lost).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any
from typing import cast as cast_

from sqlalchemy import (
    Integer,
    Table,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import insert

from memory_core.models import ConversationThread, ThreadMessage, no_live_lease

# The unique constraint a redelivered turn runs into (its session_id is stored already).
SESSION_CONSTRAINT = "uq_thread_messages_session_id"

# The claim adds a turn's size to at most this (a turn is < 2M): a finalize never overflows int4.
UNFOLDED_TOKENS_CAP = 1_000_000_000


@dataclass(frozen=True, slots=True)
class SeqClaim:
    seq: int
    summary_through_seq: int
    fold_requested: bool


def claim_params(
    *,
    thread_id: uuid.UUID,
    owner_id: str,
    agent_type: str,
    title: str,
    fold_threshold: int,
    republish_grace_s: int,
    turn_tokens: int,
    token_trigger: int,
) -> dict[str, Any]:
    """The parameters of `claim_statement` (see the module docstring);
    `turn_tokens` is the turn's tokens.turn_size (counted only when `token_trigger` > 0)."""
    return {
        "id": thread_id,
        "owner_id": owner_id,
        "agent_type": agent_type,
        "title": title,
        "threshold": fold_threshold,
        "grace_s": republish_grace_s,
        "turn_tokens": turn_tokens if token_trigger > 0 else 0,
        "token_trigger": token_trigger,
    }


@cache
def claim_statement() -> Any:
    """Built once: the finalize hot path only binds parameters (no per-call SQL construction)."""
    t = cast_(Table, ConversationThread.__table__)
    grace = func.make_interval(0, 0, 0, 0, 0, 0, bindparam("grace_s", type_=Integer))
    overdue = t.c.fold_due_at < func.now() - grace
    unfolded = t.c.last_seq + 1 - t.c.summary_through_seq
    over = unfolded > bindparam("threshold", type_=Integer)
    # The token trigger (the same condition as fold_tokens.token_due): 0 is off.
    size = bindparam("turn_tokens", type_=Integer)
    trigger = bindparam("token_trigger", type_=Integer)
    tokens = func.least(t.c.unfolded_tokens, UNFOLDED_TOKENS_CAP) + size
    over_tokens = (trigger > 0) & (tokens > trigger) & (unfolded >= 2)
    needs_fold = (over | over_tokens) & (t.c.fold_due_at.is_(None) | overdue)
    return (
        insert(t)
        .values(
            id=bindparam("id"),
            owner_id=bindparam("owner_id"),
            agent_type=bindparam("agent_type"),
            title=bindparam("title"),
            last_seq=1,
            unfolded_tokens=size,
        )
        .on_conflict_do_update(
            index_elements=[t.c.id],
            set_={
                "last_seq": t.c.last_seq + 1,
                "unfolded_tokens": tokens,
                "updated_at": func.now(),
                "fold_due_at": case((needs_fold, func.now()), else_=t.c.fold_due_at),
            },
            where=t.c.owner_id == literal_column("excluded.owner_id"),
        )
        .returning(
            t.c.last_seq,
            t.c.summary_through_seq,
            (t.c.fold_due_at == func.now()).label("fold_requested"),
        )
    )


@cache
def finalize_statement() -> Any:
    """The claim and the turn's insert as ONE statement (data-modifying CTEs), so a finalize is
    one round trip that commits on its own (autocommit): no BEGIN, no COMMIT of its own.

    Atomic as a statement: a turn whose session_id is stored already fails the whole statement
    on `SESSION_CONSTRAINT` (no ON CONFLICT), so its claim is undone with it and no seq is
    lost; the caller then reads the stored turn. No row: the thread is someone else's. Binds
    `claim_params` and the turn's columns (thread_id, session_id, user_query, answer,
    artifacts as JSON text, response_payload, completed_at)."""
    m = cast_table(ThreadMessage)
    claim = claim_statement().cte("claim")
    typed = {c: cast(bindparam(c, type_=m.c[c].type), m.c[c].type) for c in _TURN_COLUMNS}
    # The artifacts come as the JSON text pydantic serialised them to (one C call), not as
    # objects the driver's JSON processor would serialise again.
    typed["artifacts"] = cast(bindparam("artifacts", type_=Text), m.c.artifacts.type)
    turn = (
        insert(m)
        .from_select(
            ["seq", *_TURN_COLUMNS],
            select(claim.c.last_seq, *typed.values()),
        )
        .returning(m.c.seq)
        .cte("turn")
    )
    out = (claim.c.last_seq, claim.c.summary_through_seq, claim.c.fold_requested)
    return select(*out).select_from(claim.join(turn, true()))


_TURN_COLUMNS = (
    "thread_id",
    "session_id",
    "user_query",
    "answer",
    "artifacts",
    "response_payload",
    "completed_at",
)


def cast_table(model: Any) -> Table:
    return cast_(Table, model.__table__)


@cache
def stored_turn_statement() -> Any:
    """A redelivered turn as stored (session `sid`), with its thread's summary cursor and
    whether a fold is due that nobody holds (`fold_unclaimed`): the first delivery may have
    died between its COMMIT and its publish, so the redelivery publishes it (a second
    message for a fold already queued is harmless: the later one finds it done)."""
    m, t = cast_table(ThreadMessage), cast_table(ConversationThread)
    cols = ("thread_id", "seq", "session_id", "user_query", "answer", "artifacts", "completed_at")
    unleased = no_live_lease(t.c.fold_lease_until)
    # A failed fold's retry is due later (its backoff) and carried by Celery: not unclaimed.
    unclaimed = (t.c.fold_due_at <= func.now()) & unleased
    return (
        select(*(m.c[c] for c in cols), t.c.summary_through_seq, unclaimed.label("fold_unclaimed"))
        .join_from(m, t, m.c.thread_id == t.c.id)
        .where(m.c.session_id == bindparam("sid", type_=m.c.session_id.type))
    )
