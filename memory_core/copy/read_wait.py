"""Read-your-writes for enqueued turns: a read that includes a given session's turn.

An agent that enqueues turn N's finalize and reads memory for the user's next message a moment
later may run before the worker has written turn N. `get_context(wait_for=...)` makes the read
include it: subscribe to the thread's `saved` channel (every copy write publishes on it,
memory_core/copy/working_copy.py), read, and while the turn is missing wait for the next
notification — no polling — up to a bound. Subscribing before reading means no save can slip
between the read and the wait.

A turn counts as present when the context holds it, or when Postgres has it (`seq`) and the
summary already covers it (a fold ran meanwhile). A turn Postgres has but the copy lacks (the
worker's copy write failed) is served from Postgres. Redis unreachable: no notifications, so
the wait falls back to re-checking Postgres with a growing pause (0.05 s → 1 s).

At the bound: `on_timeout="raise"` raises `TurnNotReady` (its `context` is the answer without
the turn), `"flag"` returns that context with `missing_session_ids=[session]`. A thread that
does not exist yet (the enqueued turn is its first) is waited for like a turn; still unknown
at the bound, the answer is the same with an empty context (a stranger's thread answers
exactly so too: nothing tells the two apart).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Literal, Protocol
from uuid import UUID

from memory_core.copy.cache_state import CACHE_ERRORS, ThreadNotFound
from memory_core.copy.context import ConversationContext
from memory_core.io.steps import NextMessage, Read, Sleep, Steps, Subscribe
from memory_core.logs import get_logger
from memory_core.models import ThreadMessage

if TYPE_CHECKING:
    from memory_core.copy.working_copy import WorkingCopy

log = get_logger(__name__)

OnTimeout = Literal["raise", "flag"]


class HasSessionId(Protocol):
    """An enqueue's (or a save's) `SaveOutcome`."""

    @property
    def session_id(self) -> str | None: ...


class ReadsThreads(Protocol):
    """What waiting needs of a `RedisConversationMemory`: its copy's channels and its reads, as
    steps. A protocol, so this module sits below memory_core/conversation_memory.py."""

    copy: WorkingCopy

    def context_steps(self, tid: UUID, owner_id: str) -> Steps[ConversationContext]: ...

    def load_steps(self, tid: UUID, owner_id: str) -> Steps[ConversationContext]: ...


# What can name the turn to wait for: an outcome, or a session id.
WaitFor = HasSessionId | UUID | str | None
_PAUSE_MIN_S, _PAUSE_MAX_S = 0.05, 1.0


class TurnNotReady(TimeoutError):
    """The awaited turn was not saved in time; `context` is the thread without it."""

    def __init__(self, session_id: UUID, context: ConversationContext, waited_s: float) -> None:
        super().__init__(f"turn of session {session_id} not saved within {waited_s:g} s")
        self.session_id = session_id
        self.context = context


def session_to_wait_for(wait_for: WaitFor) -> UUID | None:
    """The session id named by `wait_for` (None: nothing to wait for)."""
    if wait_for is None:
        return None
    value = getattr(wait_for, "session_id", wait_for)  # a SaveOutcome, or the id itself
    if value is None:  # an outcome without a session: rejected before it had one
        return None
    try:
        return value if isinstance(value, UUID) else UUID(str(value))
    except ValueError:
        raise ValueError("wait_for must be a SaveOutcome or a session id (UUID)") from None


def context_including(
    memory: ReadsThreads,
    tid: UUID,
    owner_id: str,
    *,
    session_id: UUID,
    wait_s: float,
    on_timeout: OnTimeout,
) -> Steps[ConversationContext]:
    deadline = time.monotonic() + wait_s
    subscribed = yield from _subscribe(memory.copy.saved_channel(tid))
    pause = _PAUSE_MIN_S
    while True:
        ctx = yield from _present(memory, tid, owner_id, session_id)
        left = deadline - time.monotonic()
        if ctx is not None and not ctx.missing_session_ids:
            return ctx
        if left <= 0:
            return _timed_out(tid, session_id, ctx, wait_s, on_timeout)
        if subscribed:
            try:
                yield NextMessage(left)  # a write to this thread's copy, or the bound
                continue
            except CACHE_ERRORS:
                subscribed = False
        yield Sleep(min(pause, left))
        pause = min(pause * 2, _PAUSE_MAX_S)


def _subscribe(channel: str) -> Steps[bool]:
    try:
        yield Subscribe(channel)
    except CACHE_ERRORS:
        return False
    return True


def _present(
    memory: ReadsThreads, tid: UUID, owner_id: str, session_id: UUID
) -> Steps[ConversationContext | None]:
    """The context, with the awaited turn when it is stored; None while the thread is unknown.

    A context that still lacks the turn comes back as it is (the caller sees it missing)."""
    try:
        ctx = yield from memory.context_steps(tid, owner_id)
    except ThreadNotFound:
        return None
    if any(turn.session_id == session_id for turn in ctx.recent):
        return ctx
    stored = yield Read(
        ThreadMessage.stored_seq_statement(), {"sid": session_id, "tid": tid}, "one_or_none"
    )
    if stored is None:
        return ctx.model_copy(update={"missing_session_ids": [session_id]})
    if stored.seq <= ctx.summary_through_seq:
        return ctx  # folded into the summary already
    # Stored, but the copy lacks it (its write failed or is still in flight): Postgres has it.
    fresh = yield from memory.load_steps(tid, owner_id)
    if any(t.session_id == session_id for t in fresh.recent) or (
        stored.seq <= fresh.summary_through_seq
    ):
        return fresh
    return fresh.model_copy(update={"missing_session_ids": [session_id]})


def _timed_out(
    tid: UUID,
    session_id: UUID,
    ctx: ConversationContext | None,
    wait_s: float,
    on_timeout: OnTimeout,
) -> ConversationContext:
    log.info("memory.read_wait_timeout", thread_id=str(tid), session_id=str(session_id))
    if ctx is None:  # still unknown: as far as memory knows, an empty thread without the turn
        ctx = ConversationContext(thread_id=tid, missing_session_ids=[session_id])
    if on_timeout == "flag":
        return ctx
    raise TurnNotReady(session_id, ctx, wait_s)
