"""A fold's two writes as prebuilt single statements, sent on the fast path
(memory_core/io/fast_write.py).

Taking the lease and storing the summary (the compare-and-set) are each one UPDATE that is
atomic by itself, so each commits on its own (autocommit): one round trip, no BEGIN/COMMIT,
and no SQLAlchemy `Session` or ORM-enabled UPDATE around it. Built once per process; the
settings a fold depends on (lease seconds, fold threshold, token trigger) are parameters.
A fold measured in-process spent ~2.5 ms in each of these through the ORM against ~0.6 ms
for the same statement sent raw (docs/BENCHMARKS.md, "A fold").
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Integer, Text, bindparam, case, func, update

from memory_core.models import ConversationThread, no_live_lease
from memory_core.write.claim import cast_table

__all__ = ["lease_statement", "store_statement"]


@cache
def lease_statement() -> Any:
    """Take the fold lease of thread `tid` for `lease_s` seconds with `token`, if nobody holds
    a live one (or it is ours: a retry takes its own lease back). Returns the row a fold
    plans from, or no row (busy, or no such thread)."""
    t = cast_table(ConversationThread)
    token = bindparam("token", type_=t.c.fold_lease_token.type)
    lease_s = func.make_interval(0, 0, 0, 0, 0, 0, bindparam("lease_s", type_=Integer))
    free = no_live_lease(t.c.fold_lease_until)
    return (
        update(t)
        .where(
            t.c.id == bindparam("tid", type_=t.c.id.type), free | (t.c.fold_lease_token == token)
        )
        .values(fold_lease_token=token, fold_lease_until=func.now() + lease_s)
        .returning(
            t.c.owner_id,
            t.c.summary,
            t.c.summary_through_seq,
            t.c.last_seq,
            t.c.fold_attempts,
            t.c.unfolded_tokens,
        )
    )


@cache
def store_statement() -> Any:
    """The compare-and-set: store the summary of turns `through` < seq <= `upto` if the
    cursor is still `through` and our lease (`token`) still holds, and end the request.

    `unfolded_tokens` loses `folded` (the sizes of the folded turns) when the token trigger
    is on (`trigger` > 0) and is left alone when it is off. `fold_due_at` becomes now() when
    the thread is still over the turn threshold or the token trigger after this fold, else
    NULL: evaluated under the row lock a finalize's claim also takes (folding._due_again).
    Returns whether another fold is due, or no row (the fold lost)."""
    t = cast_table(ConversationThread)
    upto, trigger = bindparam("upto", type_=Integer), bindparam("trigger", type_=Integer)
    folded = bindparam("folded", type_=Integer)
    tokens = case(
        (trigger > 0, func.greatest(t.c.unfolded_tokens - folded, 0)), else_=t.c.unfolded_tokens
    )
    unfolded = t.c.last_seq - upto
    over = unfolded > bindparam("threshold", type_=Integer)
    # fold_tokens.token_due with the trigger as a parameter (0 is off).
    over_tokens = (trigger > 0) & (tokens > trigger) & (unfolded >= 2)
    token = bindparam("token", type_=t.c.fold_lease_token.type)
    return (
        update(t)
        .where(
            t.c.id == bindparam("tid", type_=t.c.id.type),
            t.c.summary_through_seq == bindparam("through", type_=Integer),
            t.c.fold_lease_token == token,
        )
        .values(
            summary=bindparam("summary", type_=Text),
            summary_through_seq=upto,
            summary_prompt=bindparam("prompt", type_=Text),
            summary_updated_at=func.now(),
            fold_attempts=0,
            unfolded_tokens=tokens,
            fold_due_at=case((over | over_tokens, func.now()), else_=None),
            last_fold_error=None,
            fold_lease_token=None,
            fold_lease_until=None,
        )
        .returning(t.c.fold_due_at.is_not(None).label("again"))
    )
