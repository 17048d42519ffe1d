"""The fold token trigger (issue 15, item 4) at its edges, against real Postgres and Redis.

Turns are built with an exact size (`_turn`: a one-character query and an answer of 4 x size - 1
ASCII bytes, no artifacts) and folded LLM-free, in-process, as a worker would.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, select, update

from memory_core import RedisConversationMemory, aclose_connections, save_session_to_thread_safe
from memory_core.copy.context import Exchange
from memory_core.copy.settings_check import fingerprint
from memory_core.fold.folding import Folder, FoldOutcome
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.fold.tokens import token_fold_upto
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread, ThreadMessage
from memory_core.settings import Settings
from memory_core.tokens import estimate_tokens, turn_size
from memory_core.write.artifacts import derive_artifacts
from memory_core.write.claim import UNFOLDED_TOKENS_CAP, claim_params
from memory_core.write.session_handler import asave_session_to_thread_safe
from tests.support.snapshots import BASE_TIME, make_snapshot

T = 400  # the trigger of these tests: sizes below are chosen around it


def _settings(**extra: Any) -> Settings:
    values: dict[str, Any] = {"openai_base_url": None, "openai_api_key": None}
    return Settings(
        _env_file=None, langfuse_public_key=None, langfuse_secret_key=None, **values | extra
    )


def _memory(
    redis_client: redis.Redis, trigger: int = T, threshold: int = 20, recent: int = 10
) -> RedisConversationMemory:
    return RedisConversationMemory(
        redis_client,
        settings=_settings(),
        fold_token_trigger=trigger,
        compression_threshold=threshold,
        max_recent_messages=recent,
    )


def _turn(tid: uuid.UUID, n: int, size: int, **extra: Any) -> dict[str, Any]:
    """Turn n of thread tid whose `turn_size` is exactly `size` (>= 1)."""
    empty: dict[str, Any] = {"sql": [], "visualizations": [], "dashboards": []}
    return make_snapshot(tid, n, user_query="q", answer="a" * (4 * size - 1), **empty | extra)


def _row(tid: uuid.UUID) -> ConversationThread:
    with session_scope() as s:
        return s.scalars(select(ConversationThread).where(ConversationThread.id == tid)).one()


def _set(tid: uuid.UUID, **values: Any) -> None:
    with session_scope() as s:
        s.execute(update(ConversationThread).where(ConversationThread.id == tid).values(**values))


def _unfolded_sum(tid: uuid.UUID) -> int:
    """What the counter must hold: the sizes of the turns after the cursor, from the rows."""
    with session_scope() as s:
        through = s.scalar(
            select(ConversationThread.summary_through_seq).where(ConversationThread.id == tid)
        )
        rows = ThreadMessage.between(s, tid, through or 0, 10**9)
        return sum(turn_size(Exchange.from_row(r)) for r in rows)


def _save(memory: RedisConversationMemory, snap: dict[str, Any]) -> bool:
    """Finalize one turn; True when it requested a fold."""
    out = save_session_to_thread_safe(snap, memory=memory)
    assert out.ok, out.reason
    return out.fold_published


def _drain(folder: Folder, tid: uuid.UUID, limit: int = 20) -> list[FoldOutcome]:
    """Fold as a worker would: again while a fold says more is pending (never `limit` times)."""
    outs = [folder.fold(tid)]
    while outs[-1].more_pending:
        outs.append(folder.fold(tid))
        assert len(outs) < limit, "folds keep asking for the next one: a fold loop"
    return outs


def _folder(memory: RedisConversationMemory) -> Folder:
    return Folder(memory, ConversationSummarizer(memory.settings))


def test_estimate_is_utf8_bytes_over_four_rounded_up_and_a_turn_counts_its_artifacts() -> None:
    assert [estimate_tokens(t) for t in ("", "abcd", "abcde", "é", "€€", "😀")] == [
        0,
        1,
        2,
        1,
        2,
        1,
    ]
    sql = "SELECT 1\nFROM dual"
    arts = derive_artifacts([sql], [{"id": 7, "type": "CHART", "name": "Rev", "options": {}}], [])
    ex = Exchange(
        seq=1,
        session_id=uuid.uuid4(),
        user_query="q",
        answer="ab",
        artifacts=arts,
        completed_at=BASE_TIME,
    )
    text = "q" + "ab" + sql + arts[1].one_line()  # the statement itself, the chart's one line
    assert turn_size(ex) == estimate_tokens(text) == -(-len(text.encode()) // 4)


@pytest.mark.parametrize(
    ("sizes", "upto"),
    [
        ([T], None),  # one turn alone: never, however large
        ([10 * T], None),
        ([T // 2, T // 2], None),  # exactly at the trigger
        ([T // 2, T // 2 + 1], 1),  # one token over: fold the oldest, keep the newest
        ([5 * T, 5 * T], 1),  # two huge turns: the older only
        ([10, 10, 10, T], 3),  # the newest stays even alone over T // 2
        ([T, 50, 50, 100], 1),  # keep the newest that sum to <= T // 2 (200)
        ([T, 50, 50, 101], 2),
        ([0, 0], None),
    ],
)
def test_the_token_plan(sizes: list[int], upto: int | None) -> None:
    assert token_fold_upto(list(enumerate(sizes, 1)), T) == upto
    assert token_fold_upto(list(enumerate(sizes, 1)), 0) is None  # off


@given(st.lists(st.integers(0, 3 * T), min_size=0, max_size=12), st.integers(1, 2 * T))
def test_the_token_plan_keeps_the_newest_within_half_and_folds_at_least_one(
    sizes: list[int], trigger: int
) -> None:
    upto = token_fold_upto(list(enumerate(sizes, 1)), trigger)
    if len(sizes) < 2 or sum(sizes) <= trigger:
        assert upto is None
        return
    assert upto is not None and 1 <= upto < len(sizes)
    kept = sizes[upto:]
    assert len(kept) == 1 or sum(kept) <= trigger // 2
    assert upto == 1 or sum(kept) + sizes[upto - 1] > trigger // 2  # no older turn fits


def test_exactly_at_the_trigger_no_fold_one_token_over_a_fold(redis_client: redis.Redis) -> None:
    memory = _memory(redis_client)
    folder = _folder(memory)
    tid = uuid.uuid4()
    assert not _save(memory, _turn(tid, 1, T - 100))
    assert not _save(memory, _turn(tid, 2, 100))  # unfolded tokens == T: not over
    assert _row(tid).unfolded_tokens == T
    out = folder.fold(tid)
    assert (out.status, out.more_pending, _row(tid).fold_due_at) == ("noop", False, None)
    assert _save(memory, _turn(tid, 3, 1))  # T + 1
    [out] = _drain(folder, tid)
    # Keep the newest within T // 2 (turns 2 and 3: 101), fold turn 1.
    assert (out.status, out.through_seq, out.folded, out.more_pending) == ("folded", 1, 1, False)
    row = _row(tid)
    assert (row.unfolded_tokens, row.fold_due_at) == (101, None) and _unfolded_sum(tid) == 101


def test_one_huge_turn_alone_is_never_due_and_never_loops(redis_client: redis.Redis) -> None:
    memory = _memory(redis_client)
    folder = _folder(memory)
    tid = uuid.uuid4()
    assert not _save(memory, _turn(tid, 1, 20 * T))
    out = folder.fold(tid)  # a stray request
    assert (out.status, out.more_pending) == ("noop", False)
    assert _save(memory, _turn(tid, 2, 5))  # two turns over T: the older one goes
    assert [(o.status, o.through_seq) for o in _drain(folder, tid)] == [("folded", 1)]
    # The huge turn first, then a small one: the huge one is folded, the small one stays.
    other = uuid.uuid4()
    _save(memory, _turn(other, 1, 3))
    assert _save(memory, _turn(other, 2, 20 * T))
    assert [(o.status, o.through_seq) for o in _drain(folder, other)] == [("folded", 1)]
    # Now the huge turn is alone: nothing is due, whatever the counter says.
    row = _row(other)
    assert (row.unfolded_tokens, row.fold_due_at) == (20 * T, None)
    assert (folder.fold(other).status, folder.fold(other).more_pending) == ("noop", False)


def test_two_huge_turns_fold_the_older_only(redis_client: redis.Redis) -> None:
    memory = _memory(redis_client)
    folder = _folder(memory)
    tid = uuid.uuid4()
    assert not _save(memory, _turn(tid, 1, 3 * T))
    assert _save(memory, _turn(tid, 2, 3 * T))
    outs = _drain(folder, tid)
    assert [(o.status, o.through_seq, o.folded) for o in outs] == [("folded", 1, 1)]
    ctx = memory.get_context(tid, "user-42")
    assert ctx.summary_through_seq == 1 and [e.seq for e in ctx.recent] == [2]
    assert _row(tid).unfolded_tokens == 3 * T == _unfolded_sum(tid)


def test_the_turn_count_rule_wins_when_both_apply(redis_client: redis.Redis) -> None:
    memory = _memory(redis_client, threshold=4, recent=2)
    folder = _folder(memory)
    tid = uuid.uuid4()
    published = [_save(memory, _turn(tid, n, T)) for n in range(1, 6)]
    assert published == [False, True, False, False, False]  # one request, left pending
    # 5 unfolded > 4: the turn-count rule folds 1..3 (the newest 2 stay), not the token
    # rule's 1..4; turns 4 and 5 (2 T) are still over: the token rule folds 4, then nothing.
    outs = _drain(folder, tid)
    assert [(o.through_seq, o.more_pending) for o in outs] == [(3, True), (4, False)]
    assert _row(tid).unfolded_tokens == T == _unfolded_sum(tid)


def test_a_duplicate_finalize_does_not_count_twice(redis_client: redis.Redis) -> None:
    memory = _memory(redis_client)
    tid = uuid.uuid4()
    snap = _turn(tid, 1, 123)
    assert save_session_to_thread_safe(snap, memory=memory).status == "saved"
    assert save_session_to_thread_safe(snap, memory=memory).status == "duplicate"
    assert _row(tid).unfolded_tokens == 123 == _unfolded_sum(tid)


def test_the_async_save_counts_the_same(redis_client: redis.Redis) -> None:
    memory = _memory(redis_client)
    tid = uuid.uuid4()

    async def scenario() -> list[bool]:
        try:
            return [
                (
                    await asave_session_to_thread_safe(_turn(tid, n, T // 2), memory=memory)
                ).fold_published
                for n in (1, 2, 3)
            ]
        finally:
            await aclose_connections()

    assert asyncio.run(scenario()) == [False, False, True]
    assert _row(tid).unfolded_tokens == 3 * (T // 2)


def test_a_wrong_counter_is_set_right_by_the_next_fold_without_a_loop(
    redis_client: redis.Redis,
) -> None:
    """A counter left behind by a change of setting (or rows older than the column)."""
    memory = _memory(redis_client)
    folder = _folder(memory)
    tid = uuid.uuid4()
    _save(memory, _turn(tid, 1, 10))
    _save(memory, _turn(tid, 2, 10))
    _set(tid, unfolded_tokens=10 * T)
    assert _save(memory, _turn(tid, 3, 10))  # the counter says over: a fold is requested
    assert [(o.status, o.more_pending) for o in _drain(folder, tid)] == [("noop", False)]
    assert _row(tid).unfolded_tokens == 30 == _unfolded_sum(tid)
    _set(tid, unfolded_tokens=0, fold_due_at=None)  # too low now: the rows still decide
    _save(memory, _turn(tid, 4, T))
    assert _row(tid).unfolded_tokens == T  # 30 + T really: the claim cannot know
    assert [(o.status, o.through_seq) for o in _drain(folder, tid)] == [("folded", 3)]
    assert _row(tid).unfolded_tokens == T == _unfolded_sum(tid)


def test_a_counter_near_int4_saturates_instead_of_failing_the_finalize(
    redis_client: redis.Redis,
) -> None:
    memory = _memory(redis_client)
    tid = uuid.uuid4()
    _save(memory, _turn(tid, 1, 10))
    _set(tid, unfolded_tokens=2**31 - 50)  # + 100 would overflow an int4
    assert _save(memory, _turn(tid, 2, 100))  # saved, and over the trigger
    assert _row(tid).unfolded_tokens == UNFOLDED_TOKENS_CAP + 100
    # The rows say 110: nothing to fold, and the counter is set right (no second request).
    assert [(o.status, o.more_pending) for o in _drain(_folder(memory), tid)] == [("noop", False)]
    assert _row(tid).unfolded_tokens == 110 == _unfolded_sum(tid)


def test_off_counts_nothing_and_folds_by_turn_count_only(redis_client: redis.Redis) -> None:
    claim: dict[str, Any] = {"owner_id": "u", "agent_type": "chat", "title": "t"}
    claim |= {"fold_threshold": 20, "republish_grace_s": 300, "turn_tokens": 999}
    assert claim_params(thread_id=uuid.uuid4(), token_trigger=0, **claim)["turn_tokens"] == 0
    memory = _memory(redis_client, trigger=0)
    folder = _folder(memory)
    tid = uuid.uuid4()
    folds = []
    for n in range(1, 45):  # huge turns: with the trigger on, every second one would fold
        if _save(memory, _turn(tid, n, 5 * T)):
            folds += [(n, o.through_seq) for o in _drain(folder, tid)]
        assert _row(tid).unfolded_tokens == 0
    assert folds == [(21, 11), (32, 22), (43, 33)]  # docs/ARCHITECTURE.md, "Fold arithmetic"


_HYPOTHESIS = settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# A script of what happens to a thread: ("save", size), ("again", k) = finalize the k-th saved
# turn again (a redelivery), ("fold", 0) = a fold runs (requested or not).
_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("save"), st.sampled_from([1, 7, T // 4, T // 2, T, 3 * T])),
        st.tuples(st.just("again"), st.integers(0, 30)),
        st.tuples(st.just("fold"), st.just(0)),
    ),
    min_size=1,
    max_size=18,
)


@_HYPOTHESIS
@given(actions=_ACTIONS)
def test_off_is_the_turn_count_rule_whatever_the_sizes(
    redis_client: redis.Redis, actions: list[tuple[str, int]]
) -> None:
    """Trigger 0: requests and folds exactly as the turn-count model says (T=4, R=2, C=8)."""
    memory = _memory(redis_client, trigger=0, threshold=4, recent=2)
    folder, tid = _folder(memory), uuid.uuid4()
    last = through = 0
    due = False
    for kind, size in actions:
        if kind != "fold":  # a redelivery is a new turn here: "again" only matters when on
            last += 1
            over = last - through > 4
            assert _save(memory, _turn(tid, last, max(size, 1))) == (over and not due)
            due = due or over
            continue
        out = folder.fold(tid)
        if last - through > 4:
            through = min(last - 2, through + 8)
            assert (out.status, out.through_seq) == ("folded", through)
        else:
            assert out.status in ("noop", "missing")
        due = last - through > 4
        assert out.more_pending == due
    assert last == 0 or _row(tid).unfolded_tokens == 0


@_HYPOTHESIS
@given(actions=_ACTIONS)
def test_the_counter_is_the_sum_of_the_unfolded_turns_sizes(
    redis_client: redis.Redis, actions: list[tuple[str, int]]
) -> None:
    memory = _memory(redis_client, threshold=4, recent=2)
    folder, tid = _folder(memory), uuid.uuid4()
    saved: list[dict[str, Any]] = []
    for kind, arg in actions:
        if kind == "save":
            saved.append(_turn(tid, len(saved) + 1, arg))
            _save(memory, saved[-1])
        elif kind == "again" and saved:
            assert save_session_to_thread_safe(saved[arg % len(saved)], memory=memory).ok
        elif kind == "fold":
            _drain(folder, tid)  # never loops (asserted)
        if saved:
            assert _row(tid).unfolded_tokens == _unfolded_sum(tid)
    if not saved:
        return
    _drain(folder, tid)  # once folds settle, nothing is over: count, or tokens with 2+ turns
    row = _row(tid)
    unfolded = row.last_seq - row.summary_through_seq
    assert row.fold_due_at is None and unfolded <= 4
    assert unfolded < 2 or row.unfolded_tokens <= T
    assert row.unfolded_tokens == _unfolded_sum(tid)


def test_the_setting_its_default_and_the_constructor_override(redis_client: redis.Redis) -> None:
    assert Settings(_env_file=None).memory_fold_token_trigger == 6000
    with pytest.raises(ValueError, match="memory_fold_token_trigger"):
        Settings(_env_file=None, memory_fold_token_trigger=-1)
    s = _settings(memory_fold_token_trigger=900)
    assert RedisConversationMemory(redis_client, settings=s).fold_token_trigger == 900
    off = RedisConversationMemory(redis_client, settings=s, fold_token_trigger=0)
    assert off.fold_token_trigger == 0 and "fold_token_trigger=0" in fingerprint(off)
    with pytest.raises(ValueError, match="fold_token_trigger"):
        RedisConversationMemory(redis_client, settings=s, fold_token_trigger=-5)


@pytest.mark.parametrize("trigger", [T, 0])
def test_a_fold_reads_the_turns_it_folds_once(redis_client: redis.Redis, trigger: int) -> None:
    """The token trigger's read of the unfolded turns is the fold's: its prompt is built and
    its compare-and-set subtracts their sizes from what was read once (the turn rows never
    change), not from two more reads of the same rows. Off, the fold reads them once too."""
    memory = _memory(redis_client, trigger=trigger, threshold=4, recent=2)
    folder = _folder(memory)
    tid = uuid.uuid4()
    for n in range(1, 6):
        _save(memory, _turn(tid, n, T // 4))
    reads: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM thread_messages" in statement:
            reads.append(statement)

    event.listen(memory.engine, "before_cursor_execute", count)
    try:
        out = folder.fold(tid)
    finally:
        event.remove(memory.engine, "before_cursor_execute", count)
    assert (out.status, out.through_seq, out.folded) == ("folded", 3, 3)
    assert len(reads) == 1, reads
    assert _row(tid).unfolded_tokens == (2 * (T // 4) if trigger else 0)
    assert _row(tid).unfolded_tokens == (_unfolded_sum(tid) if trigger else 0)
