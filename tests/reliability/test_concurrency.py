"""Scenario 3, concurrency: racing finalizes on one thread, racing folds, a fold racing turns.

In-process against the suite's private Postgres and Redis (the core is what workers run).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from memory_core import RedisConversationMemory, SaveOutcome, save_session_to_thread_safe
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.fold.folding import Folder, FoldOutcome
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.settings import Settings
from tests.support import figures
from tests.support.services import Stack
from tests.support.snapshots import make_snapshot
from tests.support.state import stale_copies, thread_rows
from tests.support.tally import Tally, assert_gapless

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]


def _settings(llm: FakeLLMServer, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "openai_base_url": llm.base_url,
        "openai_api_key": "sk-test",
        "langfuse_public_key": None,
        "langfuse_secret_key": None,
        "memory_llm_timeout_s": 10.0,
    }
    return Settings(_env_file=None, **values | extra)


def _race(n: int, work: Callable[[int], Any]) -> list[Any]:
    """Run work(0..n-1) on n threads released together."""
    barrier = threading.Barrier(n)

    def go(i: int) -> Any:
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))


ROUNDS = 10


def test_sixteen_concurrent_finalizes_on_one_thread(stack: Stack) -> None:
    memory = RedisConversationMemory()
    sent: dict[str, uuid.UUID] = {}
    duplicates = 0
    for r in range(ROUNDS):
        tid = uuid.uuid4()  # a new thread: the 16 racers also race to create it
        snaps = [make_snapshot(tid, n) for n in range(1, 17)]
        sent |= {s["session_id"]: tid for s in snaps}
        if r % 2 == 0:

            def save_one(i: int, snaps: list[dict[str, Any]] = snaps) -> SaveOutcome:
                return save_session_to_thread_safe(snaps[i], memory=memory)

            outs = _race(16, save_one)
        else:
            # Every racer delivers all 16 turns in its own order: 256 deliveries, 16 turns.
            def deliver_all(i: int, snaps: list[dict[str, Any]] = snaps) -> list[Any]:
                order = random.Random(i).sample(snaps, len(snaps))
                return [save_session_to_thread_safe(s, memory=memory) for s in order]

            outs = [o for per in _race(16, deliver_all) for o in per]
        statuses = sorted(o.status for o in outs)
        saved = sorted(o.seq for o in outs if o.status == "saved")
        assert saved == list(range(1, 17)), statuses
        assert set(statuses) <= {"saved", "duplicate"}
        duplicates += statuses.count("duplicate")
        ctx = memory.get_context(tid, "user-42")
        assert [e.seq for e in ctx.recent] == list(range(1, 17))
        assert {str(e.session_id) for e in ctx.recent} == {s["session_id"] for s in snaps}
        assert not stale_copies([tid], memory)
    lost, duplicated, rows = Tally(sent).check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
    figures.record(
        "concurrency.1.finalizes",
        scenario="16 concurrent finalizes on one (new) thread",
        jobs=len(sent) + duplicates,
        faults=f"{ROUNDS} rounds x 16 racers; half the rounds every racer sends all 16 turns",
        lost=lost,
        duplicated=duplicated,
        recover="n/a",
        checked=(
            f"seq 1..16 every round; {duplicates} redeliveries answered `duplicate`; "
            "working copy holds each turn once and equals Postgres"
        ),
    )


def _thread_of(
    memory: RedisConversationMemory, turns: int, sent: dict[str, uuid.UUID] | None = None
) -> uuid.UUID:
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        snap = make_snapshot(tid, n)
        assert save_session_to_thread_safe(snap, memory=memory).ok
        if sent is not None:
            sent[snap["session_id"]] = tid
    return tid


def test_two_folds_racing_one_wins_the_other_is_a_noop(stack: Stack, llm: FakeLLMServer) -> None:
    llm.delay_s = 0.5
    llm.set_mode("timeout")  # every answer takes 0.5 s: the folds overlap
    s = _settings(llm)
    memory = RedisConversationMemory(settings=s)
    folders = [Folder(memory, ConversationSummarizer(s)) for _ in range(2)]
    races = 0
    for _ in range(5):
        tid = _thread_of(memory, 21)
        calls = llm.calls

        def fold_one(i: int, tid: uuid.UUID = tid) -> FoldOutcome:
            return folders[i].fold(tid)

        outs: list[FoldOutcome] = _race(2, fold_one)
        assert sorted(o.status for o in outs) == ["busy", "folded"]
        assert llm.calls == calls + 1, "the losing fold called the LLM"
        assert folders[0].fold(tid).status == "noop"  # a repeated fold is a no-op
        row = thread_rows([tid])[tid]
        assert row.summary_through_seq == 11 and (row.summary or "").count("Running summary") == 1
        races += 1
    # The lease expired mid-call (a very slow LLM): both call it, compare-and-set picks one.
    short = _settings(llm, memory_fold_lease_s=1)
    slow_memory = RedisConversationMemory(settings=short)
    slow = [Folder(slow_memory, ConversationSummarizer(short)) for _ in range(2)]
    llm.delay_s = 1.5
    for _ in range(2):
        tid = _thread_of(slow_memory, 21)

        def staggered(i: int, tid: uuid.UUID = tid) -> FoldOutcome:
            time.sleep(1.2 * i)  # the second starts after the first's lease lapsed
            return slow[i].fold(tid)

        outs = _race(2, staggered)
        assert sorted(o.status for o in outs) == ["folded", "lost"]
        row = thread_rows([tid])[tid]
        assert row.summary_through_seq == 11 and (row.summary or "").count("Running summary") == 1
        assert not stale_copies([tid], slow_memory)
        races += 1
    figures.record(
        "concurrency.2.folds",
        scenario="two folds racing on one thread",
        jobs=2 * races,
        faults="5 races under the lease, 2 with the lease expiring mid-LLM-call",
        lost=0,
        duplicated=0,
        recover="n/a",
        checked=(
            "exactly one fold wins each race; the other is `busy` (no LLM call) or loses the "
            "compare-and-set (`lost`); a repeated fold is a `noop`; the summary holds one fold"
        ),
    )


def _new_turns(prompt: str) -> str:
    """The part of a built-in prompt that lists the turns being folded (not the old summary)."""
    return prompt.split("<conversation>", 1)[1]


def _queries(turns: str) -> set[str]:
    return {line[len("User: ") :] for line in turns.splitlines() if line.startswith("User: ")}


def test_a_fold_racing_new_turns_keeps_coverage(stack: Stack, llm: FakeLLMServer) -> None:
    llm.delay_s = 1.0
    llm.set_mode("timeout")  # the LLM takes 1 s; turns keep arriving meanwhile
    s = _settings(llm)
    memory = RedisConversationMemory(settings=s)
    folder = Folder(memory, ConversationSummarizer(s))
    arrived = 0
    sent: dict[str, uuid.UUID] = {}
    for _ in range(3):
        tid = _thread_of(memory, 21, sent)
        extra = [make_snapshot(tid, n) for n in range(22, 38)]
        sent |= {x["session_id"]: tid for x in extra}
        calls = llm.calls

        def work(i: int, tid: uuid.UUID = tid, extra: list[dict[str, Any]] = extra) -> Any:
            if i == 0:
                return folder.fold(tid)
            time.sleep(0.2)  # the fold has read its turns and is waiting on the LLM
            return [save_session_to_thread_safe(x, memory=memory) for x in extra[i - 1 :: 4]]

        results = _race(5, work)
        fold = results[0]
        assert fold.status == "folded" and fold.through_seq == 11
        assert all(o.status == "saved" for per in results[1:] for o in per)
        arrived += len(extra)
        # The LLM saw turns 1..11 only: the turns that arrived meanwhile stay verbatim.
        first = {make_snapshot(tid, n)["user_query"] for n in range(1, 12)}
        assert _queries(_new_turns(llm.prompt_text(calls))) == first
        ctx = memory.get_context(tid, "user-42")
        assert ctx.summary_through_seq == 11
        assert [e.seq for e in ctx.recent] == list(range(12, 38))
        assert not stale_copies([tid], memory)
        # The next fold takes it from there: nothing skipped, nothing folded twice.
        again = folder.fold(tid)
        assert (again.status, again.through_seq) == ("folded", 27)
        expected = {e.user_query for e in ctx.recent if e.seq <= 27}
        assert _queries(_new_turns(llm.prompt_text(-1))) == expected
    figures.record(
        "concurrency.3.fold_vs_turns",
        scenario="a fold racing new turns on its thread",
        jobs=arrived + 3 * 21,
        faults=f"3 folds with a 1 s LLM call, {arrived} turns saved from 4 threads meanwhile",
        lost=0,
        duplicated=0,
        recover="n/a",
        checked=(
            "the fold covers exactly the turns it read (1..11); turns that arrived during the "
            "LLM call stay verbatim in the copy (12..37, copy == Postgres); the next fold "
            "starts at 12"
        ),
    )
    lost, duplicated, rows = Tally(sent).check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
