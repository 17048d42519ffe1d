"""A model-based test of memory's guarantees: hypothesis drives operations and faults.

`MemoryMachine` interleaves saves, redeliveries, crashes between COMMIT and the cache write,
folds (the fake LLM answering well, failing, or with text Postgres cannot store), copy expiry,
Redis faults (down, out of memory, read-only), Postgres faults (a held row lock, terminated
sessions), strangers and reused ids, all against real Postgres and a private Redis, and after
every step checks the guarantees against a plain in-memory model:

* seq is 1..N per thread, one row per session (exactly once, order);
* `get_context` never raises for the owner, whatever Redis does, and returns exactly what
  Postgres holds: the stored summary and every unfolded turn up to the cap (coverage); only a
  turn whose finalize "crashed" after COMMIT may be missing, and only until its redelivery;
* strangers and unknown ids get `ThreadNotFound`;
* no save and no fold raises (their failures are outcomes);
* the stored summary stays within its documented bound;
* a thread over the fold threshold has its fold requested on its row (`fold_due_at`);
* every view fits its budget, keeps the summary, has room for the newest turn, and no text a
  user wrote can pose as a line of the view's structure;
* nothing is written to stdout.

The machine itself is tests/support/memory_model.py. `make test` runs a short deterministic
run (12 examples of 40 steps) and replays `PINNED`: every sequence that once found a defect,
so that the short budget need not come across it again. The long run, with fresh random
examples:

    MEMORY_MODEL_EXAMPLES=300 MEMORY_MODEL_STEPS=60 \
        make test PYTEST_ARGS="tests/test_model.py -o timeout=3600"
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    run_state_machine_as_test,
)

from tests.support.faults import (
    FaultyRedis,
)
from tests.support.memory_model import (
    INJECTIONS,
    MemoryMachine,
    World,
)
from tests.support.model_world import model_world
from tests.support.replay import Drawn, Step, replay, step


@pytest.fixture(scope="module")
def world(faulty_redis: FaultyRedis) -> Iterator[World]:
    faulty_redis.up()
    with model_world(faulty_redis) as world:
        yield world


def test_memory_guarantees_hold_under_interleaved_operations_and_faults(world: World) -> None:
    examples = int(os.environ.get("MEMORY_MODEL_EXAMPLES", "12"))
    steps = int(os.environ.get("MEMORY_MODEL_STEPS", "40"))
    run_state_machine_as_test(
        # Hypothesis documents "a class or a function" here; its annotation says only a class.
        lambda: MemoryMachine(world),  # type: ignore[arg-type]
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            # The short run in `make test` is the same every time; the long run explores.
            derandomize="MEMORY_MODEL_EXAMPLES" not in os.environ,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def _saves(n: int, i: int = 0) -> list[Step]:
    return [step("save", i=i, text=None, big_sql=False)] * n


# Every defect the model-based test has found, as the steps that show it: the short run above
# need not come across them again. Each names the commit that fixed it.
PINNED: dict[str, list[Step]] = {
    # 1579fd8, the long run: a big turn (~11 000 tokens) and one more fold by the token trigger
    # through the big one, where the turn count alone asks for nothing.
    "a_big_turn_folds_by_the_token_trigger": [
        step("save", i=0, text=None, big_sql=True),
        *_saves(1),
        step("fold", i=0, mode="ok"),
    ],
    # c7fa8f0: a fold of a thread whose copy had expired created a copy holding the summary
    # alone; the newest turns vanished from get_context.
    "a_fold_never_creates_a_working_copy": [
        *_saves(6),
        step("fold_while_the_copy_expires", i=0, mode="ok"),
        *_saves(1),
        step("fold_while_the_copy_expires", i=0, mode="llm-free"),
    ],
    # c7fa8f0: a redelivered finalize (the first one died after its COMMIT) repairs the copy.
    "a_redelivery_repairs_the_copy": [
        *_saves(1),
        step("crash_after_commit", i=0),
        step("redeliver", i=0, data=Drawn(1)),
    ],
    # c7fa8f0: a session_id reused on another thread was a silent duplicate; it is rejected.
    "a_session_id_reused_on_another_thread_is_rejected": [
        *_saves(2),
        step("reuse_session_id_on_other_thread", i=0, data=Drawn(1)),
        *_saves(1, i=1),
    ],
    # c7fa8f0: OOM, READONLY and a Redis that is down made saves raise; reads fall back.
    "saves_and_reads_never_raise_whatever_redis_does": [
        *_saves(2),
        step("redis_fault", fault="full"),
        *_saves(1),
        step("redis_fault", fault="read_only"),
        *_saves(1),
        step("expire_copy", i=0),
        step("redis_fault", fault="down"),
        *_saves(1),
        step("fold", i=0, mode="ok"),
        step("redis_recovers"),
        *_saves(3),
        step("fold", i=0, mode="ok"),
    ],
    # c7fa8f0: text Postgres cannot store (NUL, lone surrogates) made the fold vanish; an
    # unusable answer is a counted attempt. Summaries stay within their bound.
    "folds_of_unstorable_or_failed_answers_never_vanish": [
        *_saves(6),
        step("fold", i=0, mode="nul"),
        *_saves(5),
        step("fold", i=0, mode="surrogate"),
        *_saves(5),
        step("fold", i=0, mode="garbage"),
        step("fold", i=0, mode="500"),
        step("fold", i=0, mode="ok"),
    ],
    # c7fa8f0: text a user wrote posed as a line of a view's or of the fold prompt's structure.
    "user_text_never_poses_as_structure": [
        *(step("save", i=0, text=t, big_sql=False) for t in INJECTIONS),
        step("fold", i=0, mode="ok"),
    ],
    # c7fa8f0: a held row lock and terminated sessions: a save fails retryable, a fold retries.
    "postgres_faults_are_outcomes": [
        *_saves(5),
        step("postgres_row_locked", i=0),
        *_saves(1),
        step("fold", i=0, mode="ok"),
        step("postgres_sessions_terminated"),
        *_saves(1),
        step("fold", i=0, mode="ok"),
        step("postgres_recovers"),
        step("fold", i=0, mode="ok"),
    ],
    # c7fa8f0: the owner is checked inside Redis: a near-miss of the owner's id reads nothing.
    "strangers_read_nothing": [
        *_saves(1),
        *(step("stranger_reads", i=0, who=w) for w in ("mallory", "", "alice ", "ALICE")),
        step("unknown_thread_read"),
    ],
}


@pytest.mark.parametrize("steps", PINNED.values(), ids=PINNED.keys())
def test_memory_guarantees_hold_in_the_sequences_that_broke_them(
    world: World, steps: list[Step]
) -> None:
    replay(MemoryMachine(world), steps)
