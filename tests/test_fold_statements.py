"""A fold's lease and compare-and-set as single autocommitted statements
(memory_core/fold/statements.py), on real Postgres: each against the rule it implements, for any row
state (hypothesis)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, func, select, update

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.fold.folding import Folder
from memory_core.fold.statements import lease_statement, store_statement
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.io.db import get_engine, session_scope
from memory_core.io.fast_write import execute_autocommit
from memory_core.models import ConversationThread
from memory_core.settings import Settings
from tests.support.snapshots import make_snapshot

T = ConversationThread
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _thread(**values: Any) -> uuid.UUID:
    tid = uuid.uuid4()
    with session_scope() as s:
        s.add(T(id=tid, owner_id="fold-statements", agent_type="chat", title="t", **values))
    return tid


def _row(tid: uuid.UUID) -> T:
    with session_scope() as s:
        return s.scalars(select(T).where(T.id == tid)).one()


def _due_now(tid: uuid.UUID) -> bool:
    """fold_due_at was set by the statement (to its transaction's now(), in the past)."""
    with session_scope() as s:
        due = s.scalar(select(T.fold_due_at <= func.now()).where(T.id == tid))
    return bool(due)


# A thread whose cursor is `through`, with `last_seq` > through and a counter; a fold of
# through < seq <= upto; the settings it runs with.
store_cases = st.integers(0, 60).flatmap(
    lambda through: st.tuples(
        st.just(through),
        st.integers(through + 1, through + 60).flatmap(
            lambda last: st.tuples(st.just(last), st.integers(through + 1, last))
        ),
        st.integers(0, 20_000),  # unfolded_tokens
        st.integers(0, 25_000),  # folded: the folded turns' sizes (may exceed a stale counter)
        st.integers(1, 40),  # threshold
        st.sampled_from([0, 0, 50, 400, 6_000]),  # token trigger, 0 = off
    )
)


def _store(case: tuple[Any, ...], *, ours: bool = True, cursor_moved: bool = False) -> Any:
    """A thread in the state `case` describes, and the compare-and-set of its fold run on
    it: (the statement's rows, the row after, the case)."""
    through, (last, upto), tokens, folded, threshold, trigger = case
    token, other = uuid.uuid4(), uuid.uuid4()
    tid = _thread(
        summary_through_seq=through,
        last_seq=last,
        unfolded_tokens=tokens,
        fold_lease_token=token if ours else other,
        fold_attempts=3,
        last_fold_error="before",
    )
    params = {
        "tid": tid,
        "token": token,
        "through": through - 1 if cursor_moved else through,
        "upto": upto,
        "summary": "the summary",
        "prompt": "builtin:v2",
        "folded": folded,
        "threshold": threshold,
        "trigger": trigger,
    }
    return execute_autocommit(get_engine(), store_statement(), params), tid


@settings(SETTINGS, max_examples=200)
@given(case=store_cases)
def test_store_statement_follows_the_fold_arithmetic(case: tuple[Any, ...]) -> None:
    """Under our lease with the cursor unmoved, the summary is stored, the counter loses the
    folded sizes (trigger on) or is kept (off), and a fold is due again exactly when the
    thread is still over the turn threshold or the token trigger with at least 2 unfolded
    turns: docs/ARCHITECTURE.md "Fold arithmetic"."""
    _, (last, upto), tokens, folded, threshold, trigger = case
    rows, tid = _store(case)
    row = _row(tid)
    left = max(tokens - folded, 0) if trigger > 0 else tokens
    again = last - upto > threshold or (trigger > 0 and left > trigger and last - upto >= 2)
    assert [r.again for r in rows] == [again]
    assert (row.summary, row.summary_through_seq, row.unfolded_tokens) == (
        "the summary",
        upto,
        left,
    )
    assert (row.summary_prompt, row.fold_attempts, row.last_fold_error) == ("builtin:v2", 0, None)
    assert (row.fold_lease_token, row.fold_lease_until) == (None, None)
    assert (row.fold_due_at is not None) is again
    assert _due_now(tid) is again


@SETTINGS
@given(case=store_cases, ours=st.booleans())
def test_store_statement_changes_nothing_without_our_lease_or_cursor(
    case: tuple[Any, ...], ours: bool
) -> None:
    """Another token's lease, or a cursor another fold moved: no row, nothing written."""
    through, _, tokens, *_ = case
    rows, tid = _store(case, ours=ours, cursor_moved=ours)
    row = _row(tid)
    assert rows == []
    assert (row.summary, row.summary_through_seq, row.unfolded_tokens) == (None, through, tokens)
    assert (row.fold_attempts, row.last_fold_error, row.fold_due_at) == (3, "before", None)


@SETTINGS
@given(
    holder=st.sampled_from(["none", "ours", "other"]),
    expired=st.booleans(),
    lease_s=st.integers(1, 3_600),
)
def test_lease_statement_takes_a_lease_nobody_else_holds(
    holder: str, expired: bool, lease_s: int
) -> None:
    """Taken when there is no lease, an expired one, or our own (a retry); refused while
    another token's lease is live, leaving that lease as it was."""
    token, other = uuid.uuid4(), uuid.uuid4()
    values: dict[str, Any] = {"summary": "s", "summary_through_seq": 4, "last_seq": 30}
    values |= {"fold_attempts": 2, "unfolded_tokens": 77}
    if holder != "none":
        values["fold_lease_token"] = token if holder == "ours" else other
    tid = _thread(**values)
    if holder != "none":
        with session_scope() as s:
            offset = func.make_interval(0, 0, 0, 0, 0, 0, -60 if expired else 600)
            s.execute(update(T).where(T.id == tid).values(fold_lease_until=func.now() + offset))
    before = _row(tid)
    params = {"tid": tid, "token": token, "lease_s": lease_s}
    rows = execute_autocommit(get_engine(), lease_statement(), params)
    row = _row(tid)
    if holder == "other" and not expired:
        assert rows == []
        assert (row.fold_lease_token, row.fold_lease_until) == (other, before.fold_lease_until)
        return
    assert [tuple(r) for r in rows] == [("fold-statements", "s", 4, 30, 2, 77)]
    assert row.fold_lease_token == token and row.fold_lease_until is not None
    with session_scope() as s:
        left: timedelta = s.scalar(select(T.fold_lease_until - func.now()).where(T.id == tid))
    assert timedelta(seconds=lease_s - 30) < left <= timedelta(seconds=lease_s)


def test_a_lease_on_no_thread_takes_nothing() -> None:
    rows = execute_autocommit(
        get_engine(), lease_statement(), {"tid": uuid.uuid4(), "token": uuid.uuid4(), "lease_s": 9}
    )
    assert rows == []


def test_a_fold_opens_one_transaction_its_lease_and_summary_commit_on_their_own(
    redis_client: redis.Redis,
) -> None:
    """The lease and the compare-and-set are one autocommitted statement each, outside
    SQLAlchemy's connections: the one connection a fold that folds begins on is the read of
    its turns (autocommit there too: the rows never change once stored)."""
    no_llm: dict[str, Any] = {"openai_base_url": None, "openai_api_key": None}
    settings_ = Settings(
        _env_file=None, langfuse_public_key=None, langfuse_secret_key=None, **no_llm
    )
    memory = RedisConversationMemory(
        redis_client, settings=settings_, compression_threshold=4, max_recent_messages=2
    )
    folder = Folder(memory, ConversationSummarizer(settings_))  # LLM-free: no server needed
    tid = uuid.uuid4()
    for n in range(1, 6):
        assert save_session_to_thread_safe(make_snapshot(tid, n), memory=memory).status == "saved"
    begins: list[object] = []

    def begin(conn: object) -> None:
        begins.append(conn)

    event.listen(memory.engine, "begin", begin)
    try:
        out = folder.fold(tid)
    finally:
        event.remove(memory.engine, "begin", begin)
    assert (out.status, out.through_seq) == ("folded", 3)
    assert len(begins) == 1
    row = _row(tid)
    assert (row.summary_through_seq, row.fold_lease_token, row.fold_due_at) == (3, None, None)
