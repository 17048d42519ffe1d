"""Standing instructions carried across LLM folds by code: a fake LLM drops and rewrites them.

The fake LLM (a local HTTP server speaking the chat-completions protocol, called through the
real `openai` client) answers what each test scripts; the folds run against real Postgres and
Redis, and the event test runs the `memory.fold_thread` task body as a worker would.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.copy.context import Exchange
from memory_core.devservices import fake_llm
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.fold.carry_forward import carry_forward
from memory_core.fold.folding import Folder
from memory_core.fold.llm_free import parse_sections
from memory_core.fold.publisher import FOLD_QUEUE
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.instructions.detect import key_of
from memory_core.settings import Settings
from memory_core.write.artifacts import derive_artifacts
from tests.support.jobs import configure, private_events, run_job, take_jobs
from tests.support.snapshots import make_snapshot
from tests.support.state import drain_events
from workers import tasks

PREVIOUS = """Standing instructions:
- Leave out test accounts
- Show amounts in EUR
- An active customer is one with an order in the last 90 days

Goals:
- Revenue by region"""


def turn(seq: int, query: str) -> Exchange:
    return Exchange(
        seq=seq,
        session_id=uuid.UUID(int=seq),
        user_query=query,
        answer="Done.",
        artifacts=derive_artifacts((), (), ()),
        completed_at=datetime(2026, 12, 1, tzinfo=UTC),
    )


DISTRACTOR = [turn(12, "Which product sold best in March?")]


def instructions(text: str) -> list[str]:
    return parse_sections(text)["instructions"]


def test_what_the_model_dropped_is_put_back_into_its_section() -> None:
    model = "Standing instructions:\n- Show amounts in EUR\n\nGoals:\n- Best product in March"
    out = carry_forward(PREVIOUS, DISTRACTOR, model)
    assert out.restored == 2 and out.superseded_dropped == 0
    assert instructions(out.text) == [
        "Show amounts in EUR",
        "Leave out test accounts",
        "An active customer is one with an order in the last 90 days",
    ]
    assert out.text.endswith("Goals:\n- Best product in March")


def test_a_summary_without_the_section_gets_one_at_the_top() -> None:
    out = carry_forward(PREVIOUS, DISTRACTOR, "The user looks at products sold in March.")
    assert out.restored == 3
    assert out.text.startswith("Standing instructions:\n- Leave out test accounts\n")
    assert out.text.endswith("\n\nThe user looks at products sold in March.")


def test_an_instruction_only_in_prose_is_listed_in_the_section_too() -> None:
    """The next fold reads instructions back from the section only: prose would lose it."""
    model = "The user excludes test accounts and wants amounts in EUR.\n\nStanding instructions:"
    out = carry_forward(PREVIOUS, DISTRACTOR, model)
    assert out.restored == 3
    assert instructions(out.text) == [
        "Leave out test accounts",
        "Show amounts in EUR",
        "An active customer is one with an order in the last 90 days",
    ]


def test_a_rewording_under_the_same_key_counts_as_kept() -> None:
    model = (
        "**Standing instructions:**\n"
        "* Test accounts are excluded from all figures\n"
        "* All amounts are reported in EUR\n"
        "* Active customer means: ordered within the last 90 days\n"
    )
    out = carry_forward(PREVIOUS, DISTRACTOR, model)
    assert (out.restored, out.superseded_dropped, out.text) == (0, 0, model)


def test_an_instruction_the_turns_superseded_is_not_restored_and_not_kept_as_current() -> None:
    turns = [turn(12, "Actually, include test accounts again."), *DISTRACTOR]
    model = (
        "Standing instructions:\n- Leave out test accounts\n- Show amounts in EUR\n"
        "- An active customer is one with an order in the last 90 days"
    )
    out = carry_forward(PREVIOUS, turns, model)
    assert (out.restored, out.superseded_dropped) == (1, 1)
    assert "Leave out test accounts" not in out.text
    assert "Include test accounts again" in instructions(out.text)


def test_a_superseded_instruction_the_model_marks_as_no_longer_applying_stays() -> None:
    turns = [turn(12, "Switch back to calendar quarters.")]
    previous = "Standing instructions:\n- Use fiscal quarters that start in April"
    model = (
        "Standing instructions:\n- Calendar quarters again "
        "(fiscal quarters starting in April no longer apply)"
    )
    out = carry_forward(previous, turns, model)
    assert (out.restored, out.superseded_dropped, out.text) == (0, 0, model)


# ------------------------------------------------------------------ real folds


def script(monkeypatch: pytest.MonkeyPatch, answers: list[str]) -> list[str]:
    """The fake LLM answers these summaries in order; returns the prompts it received."""
    prompts: list[str] = []
    answer_iter = iter(answers)

    def scripted(body: dict[str, Any]) -> str:
        prompts.append("\n".join(m["content"] for m in body["messages"]))
        return next(answer_iter)

    monkeypatch.setattr(fake_llm, "deterministic_summary", scripted)
    return prompts


SETUP = {
    1: "Leave out test accounts from now on.",
    2: "Show amounts in EUR please.",
    3: "Use fiscal quarters that start in April.",
    13: "Actually, include test accounts again.",
}


def play(memory: RedisConversationMemory, tid: uuid.UUID, seqs: range) -> None:
    for n in seqs:
        snap = make_snapshot(tid, n, sql=[])
        if n in SETUP:
            snap["user_query"] = SETUP[n]
        assert save_session_to_thread_safe(snap, memory=memory).ok


def counter(action: str) -> float:
    value = REGISTRY.get_sample_value("memory_fold_instructions_total", {"action": action})
    return value or 0.0


def test_two_llm_folds_keep_every_instruction_the_model_dropped(
    redis_client: redis.Redis, llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        _env_file=None,
        openai_base_url=llm.base_url,
        openai_api_key="sk-test",
        langfuse_public_key=None,
        langfuse_secret_key=None,
    )
    memory = RedisConversationMemory(redis_client, settings=settings)
    folder = Folder(memory, ConversationSummarizer(settings))
    prompts = script(
        monkeypatch,
        [
            "Goals: revenue by region, fiscal quarters.",  # drops all three instructions
            "Standing instructions:\n- Leave out test accounts\n\nGoals: revenue by region.",
        ],
    )
    tid = uuid.uuid4()
    before = counter("restored"), counter("superseded_dropped")
    play(memory, tid, range(1, 22))
    first = folder.fold(tid)
    assert (first.status, first.instructions_restored, first.superseded_dropped) == ("folded", 3, 0)
    assert "- Leave out test accounts from now on" in prompts[0]  # the model was told, too
    play(memory, tid, range(22, 33))
    second = folder.fold(tid)
    # Turn 13 superseded the exclusion the model kept; EUR and the calendar it dropped.
    assert (second.instructions_restored, second.superseded_dropped) == (3, 1)
    summary = memory.get_context(tid, "user-42").summary or ""
    assert [key_of(t) for t in instructions(summary)] == [
        "currency",
        "calendar",
        "filter:test account",  # its newest wording, restored after the others
    ]
    assert "Include test accounts again" in summary and "Leave out" not in summary
    after = counter("restored"), counter("superseded_dropped")
    assert (after[0] - before[0], after[1] - before[1]) == (6, 1)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis) -> Iterator[str]:
    yield from private_events(monkeypatch, redis_client)


def test_the_memory_summarized_event_says_how_many_were_restored(
    events: str,
    redis_client: redis.Redis,
    llm: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(monkeypatch, OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="sk-test")
    script(monkeypatch, ["The user looks at revenue by region."])
    tid = uuid.uuid4()
    play(RedisConversationMemory(), tid, range(1, 22))
    take_jobs(FOLD_QUEUE, thread_id=str(tid))
    assert run_job(tasks.fold_thread, str(tid)) == {"status": "folded", "through_seq": 11}
    [done] = drain_events(redis_client, f"{events}:routine")
    assert (done.fields["instructions_restored"], done.fields["superseded_dropped"]) == ("3", "0")
