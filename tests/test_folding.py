"""Folding in-process against the fake LLM: arithmetic, CAS, leases, coverage, backoff."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from pydantic import ValidationError
from sqlalchemy import select, update

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.copy.context import Exchange
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.fold.folding import ARTIFACT_TAIL_MARKER, Folder, backoff_delay
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread
from memory_core.settings import Settings
from tests.support.snapshots import make_snapshot


def _settings(llm: FakeLLMServer | None, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "langfuse_public_key": None,
        "langfuse_secret_key": None,
        "memory_llm_timeout_s": 1.0,
    }
    if llm is not None:
        values |= {"openai_base_url": llm.base_url, "openai_api_key": "sk-test"}
    else:
        values |= {"openai_base_url": None, "openai_api_key": None}
    return Settings(_env_file=None, **values | extra)


def _memory(redis_client: Any, settings: Settings) -> RedisConversationMemory:
    return RedisConversationMemory(redis_client, settings=settings)


def _thread_row(tid: uuid.UUID) -> ConversationThread:
    with session_scope() as s:
        return s.scalars(select(ConversationThread).where(ConversationThread.id == tid)).one()


def _play(
    memory: RedisConversationMemory,
    folder: Folder,
    tid: uuid.UUID,
    turns: range,
    log: list[tuple[int, int]] | None = None,
) -> None:
    """Save turns in order, running a fold whenever finalize requested one (as a worker would)."""
    for n in turns:
        out = save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
        assert out.status == "saved", out.reason
        if out.fold_published:
            result = folder.fold(tid)
            if log is not None and result.status == "folded":
                log.append((n, result.through_seq or 0))


def test_fold_arithmetic_first_at_21_then_every_11(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm)
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    folds: list[tuple[int, int]] = []
    _play(memory, folder, tid, range(1, 101), folds)
    assert folds == [(21, 11), (32, 22), (43, 33), (54, 44), (65, 55), (76, 66), (87, 77), (98, 88)]
    assert llm.calls == 8
    ctx = memory.get_context(tid, "user-42")
    assert ctx.summary_through_seq == 88 and [e.seq for e in ctx.recent] == list(range(89, 101))
    row = _thread_row(tid)
    assert row.summary_prompt == "builtin:v2" and row.fold_attempts == 0 and row.fold_due_at is None


def test_running_summary_is_carried_into_next_prompt_with_artifact_tail(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm)
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    _play(memory, folder, tid, range(1, 33))
    assert llm.calls == 2
    first_summary, second_prompt = llm.requests[0], llm.prompt_text(1)
    assert "turn 11" in llm.prompt_text(0) and "turn 12" not in llm.prompt_text(0)
    # The LLM part of the first summary is handed to the second call; the code-appended
    # artifact tail is not (it is re-derived from the newly folded turns).
    assert "The user asked: Revenue by region for 2001" in second_prompt
    assert ARTIFACT_TAIL_MARKER.strip() not in second_prompt
    assert first_summary
    summary = memory.get_context(tid, "user-42").summary or ""
    tail = summary.split(ARTIFACT_TAIL_MARKER, 1)[1]
    assert (
        "[#20] SQL:\n  SELECT region, SUM(revenue) AS revenue FROM sales WHERE year = 2020" in tail
    )
    assert '[#22] Visualization #122 "Revenue by region 22" (chart/column)' in tail
    assert "[#19]" not in tail


def test_fold_is_noop_under_threshold_and_when_repeated(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm)
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    _play(memory, folder, tid, range(1, 21))
    assert folder.fold(tid).status == "noop" and llm.calls == 0
    _play(memory, folder, tid, range(21, 22))
    assert [folder.fold(tid).status for _ in range(3)] == ["noop"] * 3
    assert llm.calls == 1
    assert folder.fold(uuid.uuid4()).status == "missing"


def test_concurrent_folds_one_wins_other_is_noop(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm)
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    for n in range(1, 22):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    llm.delay_s = 0.5
    llm.set_mode("timeout")  # holds each request 0.5 s (< the 1 s client timeout): a slow LLM
    barrier = threading.Barrier(4)
    results: list[str] = []

    def run() -> None:
        barrier.wait()
        results.append(folder.fold(tid).status)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["busy", "busy", "busy", "folded"]
    assert llm.calls == 1 and _thread_row(tid).summary_through_seq == 11


class _Hooked:
    """A summarizer that runs `hook` while 'the LLM' is working, then delegates."""

    def __init__(self, inner: ConversationSummarizer, hook: Any) -> None:
        self.inner, self.hook, self.calls = inner, hook, 0

    def summarize(
        self, *, thread_id: str, previous_summary: str | None, exchanges: list[Exchange]
    ) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.hook()
        return self.inner.summarize(
            thread_id=thread_id, previous_summary=previous_summary, exchanges=exchanges
        )


def test_late_fold_after_lease_expiry_loses_compare_and_set(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm)
    memory = _memory(redis_client, s)
    tid = uuid.uuid4()
    for n in range(1, 22):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    plain = Folder(memory, ConversationSummarizer(s))

    def expire_lease_and_fold_elsewhere() -> None:
        with session_scope() as sess:
            sess.execute(
                update(ConversationThread)
                .where(ConversationThread.id == tid)
                .values(fold_lease_until=datetime(2000, 1, 1, tzinfo=UTC))
            )
        assert plain.fold(tid).status == "folded"

    late = Folder(memory, _Hooked(ConversationSummarizer(s), expire_lease_and_fold_elsewhere))
    assert late.fold(tid).status == "lost"
    row = _thread_row(tid)
    assert row.summary_through_seq == 11 and llm.calls == 2
    assert row.fold_lease_token is None


def test_turns_arriving_during_a_fold_stay_unfolded(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm)
    memory = _memory(redis_client, s)
    tid = uuid.uuid4()
    for n in range(1, 22):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)

    def new_turns() -> None:
        for n in range(22, 27):
            assert save_session_to_thread_safe(make_snapshot(tid, n), memory=memory).ok

    folder = Folder(memory, _Hooked(ConversationSummarizer(s), new_turns))
    assert folder.fold(tid).through_seq == 11
    ctx = memory.get_context(tid, "user-42")
    assert ctx.summary_through_seq == 11 and [e.seq for e in ctx.recent] == list(range(12, 27))
    memory.invalidate(tid)
    assert memory.get_context(tid, "user-42") == ctx


def test_turns_that_take_the_thread_over_during_a_fold_ask_for_the_next_one(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    """The finalizes of turns 22-32 see a fold pending and publish none; the fold that ends
    must see that the thread is over the threshold again (32 - 11 > 20) and ask itself, or the
    thread's last turns stay unfolded until some later turn comes."""
    s = _settings(llm)
    memory = _memory(redis_client, s)
    tid = uuid.uuid4()
    for n in range(1, 22):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    published: list[bool] = []

    def new_turns() -> None:
        for n in range(22, 33):
            published.append(
                save_session_to_thread_safe(make_snapshot(tid, n), memory=memory).fold_published
            )

    folder = Folder(memory, _Hooked(ConversationSummarizer(s), new_turns))
    out = folder.fold(tid)
    assert (out.status, out.through_seq, out.more_pending) == ("folded", 11, True)
    assert published == [False] * 11
    assert _thread_row(tid).fold_due_at is not None  # a later turn does not republish at once
    assert folder.fold(tid).through_seq == 22


def test_a_turn_that_takes_the_thread_over_during_a_noop_fold_asks_for_the_next_one(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm)
    memory = _memory(redis_client, s)
    tid = uuid.uuid4()
    for n in range(1, 21):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    with session_scope() as sess:  # a fold is pending (a duplicate request, say)
        sess.execute(
            update(ConversationThread)
            .where(ConversationThread.id == tid)
            .values(fold_due_at=datetime.now(UTC))
        )
    published: list[bool] = []

    class Interleaved(Folder):
        def _fold_upto(self, through: int, last_seq: int) -> int | None:
            upto = super()._fold_upto(through, last_seq)  # 20 turns: nothing to fold
            published.append(
                save_session_to_thread_safe(make_snapshot(tid, 21), memory=memory).fold_published
            )
            return upto

    out = Interleaved(memory, ConversationSummarizer(s)).fold(tid)
    assert (out.status, out.more_pending, published) == ("noop", True, [False])
    assert _thread_row(tid).fold_due_at is not None
    assert Folder(memory, ConversationSummarizer(s)).fold(tid).through_seq == 11
    row = _thread_row(tid)
    assert (row.summary_through_seq, row.fold_due_at) == (11, None)


@pytest.mark.parametrize("mode", ["500", "timeout", "empty", "garbage"])
def test_llm_failure_modes_count_as_failed_attempts(
    redis_client: redis.Redis, llm: FakeLLMServer, mode: str
) -> None:
    s = _settings(llm)
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    for n in range(1, 22):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    llm.set_mode(mode)
    out = folder.fold(tid)
    assert (out.status, out.attempt, out.retry_in_s) == ("failed", 1, 60)
    assert out.error and out.session_id == str(
        memory.get_context(tid, "user-42").recent[10].session_id
    )
    row = _thread_row(tid)
    assert row.summary is None and row.summary_through_seq == 0 and row.fold_attempts == 1
    assert row.last_fold_error and row.fold_lease_token is None


def test_backoff_sequence_is_persisted_and_capped(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    assert [backoff_delay(n) for n in range(1, 10)] == [
        60,
        120,
        240,
        480,
        960,
        1920,
        3600,
        3600,
        3600,
    ]
    s = _settings(llm, memory_fold_max_llm_attempts=100)  # the raw backoff, no fallback
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    for n in range(1, 22):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    llm.set_mode("500")
    delays = []
    for attempt in range(1, 9):
        out = folder.fold(tid)
        assert out.attempt == attempt
        delays.append(out.retry_in_s)
        row = _thread_row(tid)
        assert row.fold_due_at is not None and out.retry_in_s is not None
        due_in = (row.fold_due_at - datetime.now(UTC)).total_seconds()
        assert out.retry_in_s - 30 < due_in <= out.retry_in_s
    assert delays == [60, 120, 240, 480, 960, 1920, 3600, 3600]
    llm.set_mode("ok")
    assert folder.fold(tid).status == "folded"
    row = _thread_row(tid)
    assert (row.fold_attempts, row.fold_due_at, row.last_fold_error) == (0, None, None)


def test_the_backoff_comes_from_the_settings(redis_client: redis.Redis, llm: FakeLLMServer) -> None:
    """MEMORY_FOLD_BACKOFF_BASE_S / _CAP_S: what a test or an operator sets is what a failed
    fold waits, on the row and in its outcome; a cap below the base is refused."""
    assert [backoff_delay(n, 5, 30) for n in range(1, 6)] == [5, 10, 20, 30, 30]
    s = _settings(
        llm,
        memory_fold_max_llm_attempts=100,
        memory_fold_backoff_base_s=7,
        memory_fold_backoff_cap_s=20,
    )
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    for n in range(1, 22):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    llm.set_mode("500")
    delays = [folder.fold(tid).retry_in_s for _ in range(4)]
    assert delays == [7, 14, 20, 20]
    due_at = _thread_row(tid).fold_due_at
    assert due_at is not None and 0 < (due_at - datetime.now(UTC)).total_seconds() <= 20
    with pytest.raises(ValidationError, match="MEMORY_FOLD_BACKOFF_CAP_S"):
        _settings(llm, memory_fold_backoff_base_s=60, memory_fold_backoff_cap_s=30)


def test_llm_down_for_50_turns_then_recovers_with_full_coverage(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm, memory_fold_max_llm_attempts=100)  # recovery, not the fallback
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    _play(memory, folder, tid, range(1, 22))  # first fold ok: through 11
    llm.set_mode("500")
    for n in range(22, 72):  # 50 turns while every fold attempt fails
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
        if n % 5 == 0 and n > 31:  # over the threshold again from turn 32
            assert folder.fold(tid).status == "failed"
        ctx = memory.get_context(tid, "user-42")
        # Coverage: summary through 11, every later turn verbatim, up to the cap of 40.
        assert ctx.summary_through_seq == 11
        assert [e.seq for e in ctx.recent] == list(range(max(12, n - 39), n + 1))
    ok_before = llm.calls
    llm.set_mode("ok")
    statuses = []
    while (out := folder.fold(tid)).status == "folded":
        statuses.append(out.through_seq)
        if not out.more_pending:
            break
    # A 60-turn backlog (12..71): one bounded prompt of 40 turns (12..51, including the turns
    # the capped working copy had dropped) leaves 20 unfolded: not over the threshold.
    assert statuses == [51]
    folded_prompts = "\n".join(llm.prompt_text(i) for i in range(ok_before, llm.calls))
    for n in range(12, 52):
        assert f"(turn {n})" in folded_prompts, f"turn {n} never reached the summarizer"
    ctx = memory.get_context(tid, "user-42")
    assert ctx.summary_through_seq == 51 and [e.seq for e in ctx.recent] == list(range(52, 72))
    # One more turn takes it over the threshold again: the normal cadence resumes.
    _play(memory, folder, tid, range(72, 73))
    assert memory.get_context(tid, "user-42").summary_through_seq == 62


def test_without_llm_the_fold_is_llm_free_and_deterministic(redis_client: redis.Redis) -> None:
    s = _settings(None)
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    summaries = []
    for _ in range(2):
        tid = uuid.uuid4()
        _play(memory, folder, tid, range(1, 22))
        row = _thread_row(tid)
        assert row.summary_prompt == "llm-free:v2" and row.summary_through_seq == 11
        summaries.append(row.summary)
    assert summaries[0] == summaries[1]
    assert "excluding returns" in (summaries[0] or "").lower()


def test_a_lost_retry_is_republished_by_a_later_finalize_once(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    from datetime import timedelta

    s = _settings(llm)
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    outs = [save_session_to_thread_safe(make_snapshot(tid, n), memory=memory) for n in range(1, 22)]
    assert [o.seq for o in outs if o.fold_published] == [21]
    llm.set_mode("500")
    assert folder.fold(tid).status == "failed"  # retry due in 60 s, carried by Celery
    # While the retry is pending, finalizes do not stack more folds.
    assert not save_session_to_thread_safe(make_snapshot(tid, 22), memory=memory).fold_published
    # The retry message is lost (say, its worker host died): once it is overdue by more than
    # the grace period, the next finalize publishes the fold again, and only that one does.
    grace = s.memory_fold_republish_grace_s
    with session_scope() as sess:
        sess.execute(
            update(ConversationThread)
            .where(ConversationThread.id == tid)
            .values(fold_due_at=datetime.now(UTC) - timedelta(seconds=grace + 5))
        )
    assert save_session_to_thread_safe(make_snapshot(tid, 23), memory=memory).fold_published
    assert not save_session_to_thread_safe(make_snapshot(tid, 24), memory=memory).fold_published


def test_a_redelivery_publishes_the_fold_its_first_delivery_did_not(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    """Turn 21 requests the first fold, but its publish never happens (here: the broker is
    unreachable; in a worker: the process killed between COMMIT and publish) and the thread
    goes quiet. No later turn comes to republish it; the turn's redelivery does."""
    s = _settings(llm)
    memory = _memory(redis_client, s)
    tid = uuid.uuid4()
    for n in range(1, 21):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    cut_off = _memory(redis_client, _settings(llm, celery_broker_url="redis://127.0.0.1:1/0"))
    snap = make_snapshot(tid, 21)
    first = save_session_to_thread_safe(snap, memory=cut_off)
    assert (first.status, first.fold_published) == ("saved", False)
    assert _thread_row(tid).fold_due_at is not None  # requested, with no message anywhere
    again = save_session_to_thread_safe(snap, memory=memory)
    assert (again.status, again.seq, again.fold_published) == ("duplicate", 21, True)
    # Once the fold ran, a further redelivery publishes nothing: no fold is due.
    assert Folder(memory, ConversationSummarizer(s)).fold(tid).status == "folded"
    assert not save_session_to_thread_safe(snap, memory=memory).fold_published
    # Nor while a fold holds its lease, nor while a failed fold waits for its retry.
    for n in range(22, 32):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    snap = make_snapshot(tid, 32)
    assert save_session_to_thread_safe(snap, memory=memory).fold_published  # the second fold
    with session_scope() as sess:
        lease = datetime.now(UTC) + timedelta(seconds=60)
        sess.execute(
            update(ConversationThread)
            .where(ConversationThread.id == tid)
            .values(fold_lease_until=lease, fold_lease_token=uuid.uuid4())
        )
    assert not save_session_to_thread_safe(snap, memory=memory).fold_published
    with session_scope() as sess:
        retry_at = datetime.now(UTC) + timedelta(seconds=60)
        sess.execute(
            update(ConversationThread)
            .where(ConversationThread.id == tid)
            .values(fold_lease_until=None, fold_lease_token=None, fold_due_at=retry_at)
        )
    assert not save_session_to_thread_safe(snap, memory=memory).fold_published
    # The same row with the lease gone and the fold due: the redelivery publishes it.
    with session_scope() as sess:
        sess.execute(
            update(ConversationThread)
            .where(ConversationThread.id == tid)
            .values(fold_due_at=datetime.now(UTC))
        )
    assert save_session_to_thread_safe(snap, memory=memory).fold_published


def test_an_error_no_retry_can_fix_falls_back_to_the_llm_free_fold_at_once(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm)
    memory = _memory(redis_client, s)
    tid = uuid.uuid4()
    for n in range(1, 22):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    llm.set_mode("context_length")
    out = Folder(memory, ConversationSummarizer(s)).fold(tid)
    assert (out.status, out.through_seq, out.prompt) == ("folded", 11, "llm-free:v2")
    assert out.fallback == (
        "not retryable: SummarizationError: LLM HTTP 400 (context_length_exceeded)"
    )
    row = _thread_row(tid)
    assert (row.fold_attempts, row.fold_due_at, row.summary_prompt) == (0, None, "llm-free:v2")
    # The LLM-free summary: the condition every query applied leads, as a standing instruction.
    assert row.summary and row.summary.startswith("Standing instructions:\n")
    assert "- Applied in SQL: NOT is_return" in row.summary


def test_a_retryable_error_falls_back_after_the_attempts_run_out(
    redis_client: redis.Redis, llm: FakeLLMServer
) -> None:
    s = _settings(llm, memory_fold_max_llm_attempts=3)
    memory = _memory(redis_client, s)
    folder = Folder(memory, ConversationSummarizer(s))
    tid = uuid.uuid4()
    for n in range(1, 22):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    llm.set_mode("500")
    assert [folder.fold(tid).status for _ in range(2)] == ["failed", "failed"]
    out = folder.fold(tid)
    assert (out.status, out.through_seq) == ("folded", 11)
    assert (
        out.fallback == "3 failed attempts, last: SummarizationError: LLM HTTP 500 (server_error)"
    )
    assert llm.calls == 3
    llm.set_mode("ok")  # the next fold asks the LLM again
    for n in range(22, 32):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    snap = make_snapshot(tid, 32)
    assert save_session_to_thread_safe(snap, memory=memory).fold_published  # the second fold
    again = folder.fold(tid)
    assert (again.status, again.prompt, again.fallback) == ("folded", "builtin:v2", None)
