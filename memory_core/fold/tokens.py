"""The fold token trigger: when the unfolded turns' sizes make a fold due, and what it folds.

`conversation_threads.unfolded_tokens` counts the estimated tokens (`tokens.turn_size`) of the
unfolded turns: a finalize adds its turn's size (in the claim, under the thread row lock), a
fold's compare-and-set subtracts the sizes of the turns it folded. A fold is due by tokens when
the trigger T is on (> 0), unfolded_tokens > T and at least 2 turns are unfolded: a single turn,
however large, is never folded by tokens (there is nothing to keep verbatim beside it), so a
fold never asks for a next one that could not fold anything.

The counter only says when to look. A fold decides from the turn rows themselves
(`token_fold_upto`): it keeps the newest turns whose sizes sum to at most T // 2 (at least the
newest turn) and folds the rest (at least the oldest unfolded turn). It also corrects the
counter by what the rows say (`correct_counter`): a counter left behind by a change of the
setting, or by turns stored before the column existed, is exact again after one fold, and a
fold that finds nothing to do cannot ask for itself again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sqlalchemy import Connection, Integer, bindparam, false, func, select, update

from memory_core.copy.context import Exchange
from memory_core.models import ConversationThread, ThreadMessage
from memory_core.tokens import turn_size
from memory_core.write.claim import UNFOLDED_TOKENS_CAP, cast_table

if TYPE_CHECKING:
    from memory_core.conversation_memory import RedisConversationMemory

__all__ = [
    "TokenPlan",
    "correct_counter",
    "token_due",
    "token_fold_upto",
    "token_upto",
    "unfolded_turns",
]


class LeaseLike(Protocol):
    """What a fold's lease read from the thread row (folding._Lease)."""

    @property
    def through(self) -> int: ...
    @property
    def last_seq(self) -> int: ...
    @property
    def unfolded_tokens(self) -> int: ...


def token_due(tokens: Any, unfolded_turns: Any, trigger: int) -> Any:
    """SQL: a fold is due by tokens (`tokens`, `unfolded_turns`: the row's values as they
    will be). The claim (models.claim_statement) binds the same condition."""
    if trigger <= 0:
        return false()
    return (tokens > trigger) & (unfolded_turns >= 2)


def token_fold_upto(sizes: Sequence[tuple[int, int]], trigger: int) -> int | None:
    """Highest seq a token-triggered fold covers, or None when none is due.

    `sizes`: (seq, turn_size) of every unfolded turn, oldest first. Keeps the newest turns
    whose sizes sum to at most `trigger // 2` (at least the newest), folds the rest (at least
    the oldest).
    """
    if trigger <= 0 or len(sizes) < 2 or sum(size for _, size in sizes) <= trigger:
        return None
    keep, kept = 1, sizes[-1][1]
    while keep < len(sizes) - 1 and kept + sizes[-keep - 1][1] <= trigger // 2:
        kept += sizes[-keep - 1][1]
        keep += 1
    return sizes[-keep - 1][0]


class TokenPlan(NamedTuple):
    """What the token trigger read under the lease: the turns a fold may cover, once.

    `turns` (oldest first) and `sizes` are every unfolded turn as of the lease, or None when
    nothing was read (trigger off, fewer than 2 unfolded turns). Turn rows never change once
    stored, so the fold builds its prompt from these and its compare-and-set subtracts these
    sizes, instead of reading the same rows twice more.
    """

    upto: int | None
    turns: list[Exchange] | None = None
    sizes: list[tuple[int, int]] | None = None

    def covered(self, upto: int) -> tuple[list[Exchange], int | None] | None:
        """The turns seq <= upto and the sum of their sizes; None when nothing was read."""
        if self.turns is None or self.sizes is None:
            return None
        turns = [t for t in self.turns if t.seq <= upto]
        return turns, sum(n for seq, n in self.sizes if seq <= upto)


@cache
def _turns_statement() -> Any:
    """The turns tid's after < seq <= through, oldest first (Core: no ORM around the rows)."""
    m = cast_table(ThreadMessage)
    cols = ("seq", "session_id", "user_query", "answer", "artifacts", "completed_at")
    return (
        select(*(m.c[c] for c in cols))
        .where(
            m.c.thread_id == bindparam("tid", type_=m.c.thread_id.type),
            m.c.seq > bindparam("after", type_=Integer),
            m.c.seq <= bindparam("through", type_=Integer),
        )
        .order_by(m.c.seq)
    )


def unfolded_turns(
    conn: Connection, tid: uuid.UUID, after_seq: int, through_seq: int
) -> list[Exchange]:
    """The turns after_seq < seq <= through_seq, oldest first, as a fold reads them."""
    params = {"tid": tid, "after": after_seq, "through": through_seq}
    return [Exchange.from_row(row) for row in conn.execute(_turns_statement(), params)]


def correct_counter(conn: Connection, tid: uuid.UUID, token: uuid.UUID, drift: int) -> None:
    """Take `drift` (the counter at the lease minus the sizes of the turns it covered) off
    `unfolded_tokens`, under our lease. A delta, not a value: turns stored since the lease
    have added their own sizes and keep them. One statement, atomic by itself."""
    if drift == 0:
        return
    t = cast_table(ConversationThread)
    conn.execute(
        update(t)
        .where(t.c.id == tid, t.c.fold_lease_token == token)
        .values(unfolded_tokens=func.greatest(t.c.unfolded_tokens - drift, 0))
    )


def token_upto(
    memory: RedisConversationMemory, tid: uuid.UUID, token: uuid.UUID, lease: LeaseLike
) -> TokenPlan:
    """The token trigger's part of a fold's plan, under our lease: read the unfolded turns
    (as of the lease), set the counter right by them, and return them with the highest seq a
    fold by tokens covers (at most `max_unfolded_messages` turns), or None. Off, or fewer than
    2 unfolded turns: None, and nothing is read."""
    trigger = memory.fold_token_trigger
    if trigger <= 0 or lease.last_seq - lease.through < 2:
        return TokenPlan(None)
    # Autocommit: one round trip per statement, no BEGIN/COMMIT. The rows read never change
    # once stored, and the correction is a delta under our lease: no transaction needed.
    with memory.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        turns = unfolded_turns(conn, tid, lease.through, lease.last_seq)
        sizes = [(t.seq, turn_size(t)) for t in turns]
        exact = min(sum(n for _, n in sizes), UNFOLDED_TOKENS_CAP)  # as a claim would count
        correct_counter(conn, tid, token, lease.unfolded_tokens - exact)
    upto = token_fold_upto(sizes, trigger)
    if upto is not None:
        upto = min(upto, lease.through + memory.max_unfolded_messages)
    return TokenPlan(upto, turns, sizes)
