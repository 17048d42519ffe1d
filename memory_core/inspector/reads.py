"""What the inspector shows, read from the canon (Postgres) and Redis without writing either.

A thread's page is what an operator needs on a "the agent forgot" report: the summary with its
standing instructions set apart, every turn as stored, each node view as the node would get it
under a budget, the fold's bookkeeping and the thread's recent events. The views are rendered
from Postgres (the canon the working copy is rebuilt from), so the page never fills or changes
the copy; whether a copy exists is shown beside them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.copy.cache_state import CACHE_ERRORS, describe_cache_error
from memory_core.copy.views import FOCUSES, render_conversation_context
from memory_core.events import Event, routine_stream
from memory_core.fold.llm_free import INSTRUCTIONS_HEADER, parse_sections
from memory_core.fold.summary_tail import stored_summary_bound
from memory_core.io.sync_driver import run_sync
from memory_core.lifecycle.threads import ThreadInfo, list_threads
from memory_core.models import ConversationThread, ThreadMessage
from memory_core.tokens import count_tokens

MAX_TURNS = 200  # newest first on the page; the count says how many there are
MAX_EVENTS = 25
EVENT_SCAN = 5000  # newest entries of each stream looked through for the thread's events
MAX_VIEW_TOKENS = 100_000
THREADS_LISTED = 100


@dataclass(frozen=True)
class Turn:
    seq: int
    session_id: str
    user_query: str
    answer: str
    artifacts: list[dict[str, Any]]
    completed_at: datetime


@dataclass(frozen=True)
class View:
    text: str
    tokens: int


@dataclass(frozen=True)
class ThreadPage:
    """One thread's memory as the inspector shows it (and /api/threads/{id} returns)."""

    thread_id: uuid.UUID
    owner_id: str
    title: str
    agent_type: str
    is_archived: bool
    created_at: datetime
    updated_at: datetime
    summary: str | None
    summary_rest: str  # the summary without its standing-instructions section
    standing_instructions: list[str]
    summary_tokens: int
    summary_bound: int
    turn_count: int
    turns: list[Turn]  # the newest MAX_TURNS, oldest first
    max_tokens: int
    views: dict[str, View]
    fold: dict[str, Any]
    copy: str  # "present, expires in ..." / "absent" / "unavailable: ..."
    events: list[Event] = field(default_factory=list)
    events_error: str = ""


def find_threads(memory: RedisConversationMemory, owner: str) -> list[ThreadInfo]:
    """The owner's threads, archived ones included, most recently active first."""
    return list_threads(owner, include_archived=True, limit=THREADS_LISTED, memory=memory)


def thread_owner(memory: RedisConversationMemory, thread_id: uuid.UUID) -> ThreadInfo | None:
    """The thread as a listing row, or None: the look-up by id, whoever owns it."""
    with memory.session_factory() as session:
        t = session.get(ConversationThread, thread_id)
        if t is None:
            return None
        return ThreadInfo(
            t.id,
            t.title,
            t.agent_type,
            t.last_seq,
            t.is_archived,
            t.archived_at,
            t.created_at,
            t.updated_at,
        )


def read_thread(
    memory: RedisConversationMemory, thread_id: uuid.UUID, max_tokens: int
) -> ThreadPage | None:
    """The thread's page, or None when there is no such thread (never was, or deleted)."""
    with memory.session_factory() as session:
        t = session.get(ConversationThread, thread_id)
        if t is None:
            return None
        rows = session.scalars(
            select(ThreadMessage)
            .where(ThreadMessage.thread_id == thread_id)
            .order_by(ThreadMessage.seq.desc())
            .limit(MAX_TURNS)
        ).all()
        turns = [
            Turn(r.seq, str(r.session_id), r.user_query, r.answer, r.artifacts, r.completed_at)
            for r in reversed(rows)
        ]
        fold = _fold_state(t)
        owner, head = t.owner_id, (t.title, t.agent_type, t.is_archived, t.created_at)
        updated_at, turn_count = t.updated_at, t.last_seq
    ctx, _ = run_sync(memory.load_with_last_steps(thread_id, owner), memory.sync_io())
    summary = ctx.summary
    standing, rest = split_summary(summary)
    views: dict[str, View] = {}
    for focus in FOCUSES:
        text = render_conversation_context(ctx, focus, max_tokens)
        views[focus] = View(text, count_tokens(text))
    events, events_error = thread_events(memory, thread_id)
    return ThreadPage(
        thread_id=thread_id,
        owner_id=owner,
        title=head[0],
        agent_type=head[1],
        is_archived=head[2],
        created_at=head[3],
        updated_at=updated_at,
        summary=summary,
        summary_rest=rest,
        standing_instructions=standing,
        summary_tokens=count_tokens(summary or ""),
        summary_bound=stored_summary_bound(memory.settings.memory_summary_max_tokens),
        turn_count=turn_count,
        turns=turns,
        max_tokens=max_tokens,
        views=views,
        fold=fold,
        copy=copy_state(memory, thread_id),
        events=events,
        events_error=events_error,
    )


def _fold_state(t: ConversationThread) -> dict[str, Any]:
    return {
        "summary_through_seq": t.summary_through_seq,
        "last_seq": t.last_seq,
        "unfolded_turns": t.last_seq - t.summary_through_seq,
        "unfolded_tokens": t.unfolded_tokens,
        "attempts": t.fold_attempts,
        "next_due": t.fold_due_at,
        "lease_until": t.fold_lease_until,
        "prompt_version": t.summary_prompt,
        "summary_updated_at": t.summary_updated_at,
        "last_error": t.last_fold_error,
    }


def split_summary(summary: str | None) -> tuple[list[str], str]:
    """(the standing instructions, the rest of the summary's lines): the section as the next
    fold reads it back (parse_sections), and the text around it as stored."""
    standing = parse_sections(summary)["instructions"]
    rest: list[str] = []
    inside = False
    for line in (summary or "").splitlines():
        stripped = line.strip()
        if stripped.lstrip("#* ").rstrip("* ").casefold() == INSTRUCTIONS_HEADER.casefold():
            inside = True
            continue
        if inside and (not stripped or stripped[:1] in "-*\u2022"):
            continue
        inside = False
        rest.append(line)
    return standing, "\n".join(rest).strip("\n")


def copy_state(memory: RedisConversationMemory, thread_id: uuid.UUID) -> str:
    """Whether the thread has a working copy in Redis, and for how long."""
    meta, _turns = memory.copy.keys(thread_id)
    try:
        ttl_ms = int(memory.redis.pttl(meta))
    except CACHE_ERRORS as exc:
        return f"unavailable: {describe_cache_error(exc)}"
    if ttl_ms == -2:
        return "absent (the next read rebuilds it from Postgres)"
    if ttl_ms < 0:
        return "present, no expiry"
    return f"present, expires in {ttl_ms / 3_600_000:.1f} h"


def thread_events(memory: RedisConversationMemory, thread_id: uuid.UUID) -> tuple[list[Event], str]:
    """The thread's newest events from both streams (failures and routine), newest first; and
    an error line when Redis did not answer."""
    wanted = str(thread_id)
    stream = memory.settings.memory_events_stream
    found: list[Event] = []
    try:
        for name in (stream, routine_stream(stream)):
            for entry_id, raw in memory.redis.xrevrange(name, count=EVENT_SCAN) or []:
                event = Event.from_entry(entry_id, raw)
                if event.thread_id == wanted:
                    found.append(event)
    except CACHE_ERRORS as exc:
        return [], f"unavailable: {describe_cache_error(exc)}"
    found.sort(key=lambda e: _entry_order(e.id), reverse=True)
    return found[:MAX_EVENTS], ""


def _entry_order(entry_id: str) -> tuple[int, int]:
    ms, _, n = entry_id.partition("-")
    return (int(ms), int(n or 0)) if ms.isdigit() and (n or "0").isdigit() else (0, 0)
