"""What the LLM answers, at its worst: only a finished summary in words is stored, and what code
knows of the standing instructions wins over the model's version of them.

Real folds (`Folder.fold`, real Postgres and Redis) against a scripted chat-completions server
(tests/support/scripted_llm.py) that answers the completion each test writes: its finish
reason, a refusal, a tool call, the prompt sent back, a section put last or reworded.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.fold.folding import Folder, FoldOutcome
from memory_core.fold.llm_free import INSTRUCTIONS_HEADER, LLM_FREE_LABEL, parse_sections
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.fold.summary_tail import strip_artifact_tail
from memory_core.instructions.detect import detect
from memory_core.settings import Settings
from memory_core.tokens import count_tokens
from tests.support.scripted_llm import ScriptedLLMServer, prompt_texts
from tests.support.snapshots import make_snapshot

# A summary any validation passes; its one rare word shows whether it was stored.
SUMMARY = "The user studies revenue by region in the Zanzibar market, quarter by quarter."
SETUP = {
    1: "From now on, exclude test accounts.",
    2: "Show amounts in EUR from now on.",
    3: "Use fiscal quarters that start in April.",
    4: "Actually, include test accounts again.",
}


@pytest.fixture
def llm() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        yield server


def settings_for(llm: ScriptedLLMServer, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "openai_base_url": llm.base_url,
        "openai_api_key": "sk-test",
        "langfuse_public_key": None,
        "langfuse_secret_key": None,
        "memory_llm_timeout_s": 5.0,
        # A fold at turn 5 folds turns 1-3, at turn 8 turns 4-6.
        "memory_compression_threshold": 4,
        "memory_max_recent_messages": 2,
        "memory_summary_max_tokens": 300,
    }
    return Settings(_env_file=None, **values | extra)


class Thread:
    """One thread, its turns saved as an agent would, its folds run as a worker would."""

    def __init__(self, redis_client: redis.Redis, settings: Settings) -> None:
        self.memory = RedisConversationMemory(redis_client, settings=settings)
        self.folder = Folder(self.memory, ConversationSummarizer(settings))
        self.tid = uuid.uuid4()
        self.last = 0

    def play(self, upto: int, queries: dict[int, str] | None = None) -> None:
        for n in range(self.last + 1, upto + 1):
            snap = make_snapshot(self.tid, n, sql=[])
            queries = SETUP if queries is None else queries
            if n in queries:
                snap["user_query"] = queries[n]
            assert save_session_to_thread_safe(snap, memory=self.memory).ok
        self.last = upto

    def fold(self) -> FoldOutcome:
        return self.folder.fold(self.tid)

    def summary(self) -> str:
        return strip_artifact_tail(self.memory.get_context(self.tid, "user-42").summary) or ""


@pytest.fixture
def make_thread(redis_client: redis.Redis) -> Any:
    return lambda settings: Thread(redis_client, settings)


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    "answer",
    [
        {"content": SUMMARY, "finish_reason": "content_filter"},
        {"content": SUMMARY, "finish_reason": "length"},
        {"content": SUMMARY, "refusal": "I can't help with that."},
        {"content": None, "refusal": "I can't help with that."},
        {"content": SUMMARY, "tool_calls": [TOOL_CALL], "finish_reason": "tool_calls"},
        {"content": SUMMARY, "tool_calls": [TOOL_CALL]},
        {"content": SUMMARY, "function_call": TOOL_CALL["function"], "finish_reason": "stop"},
        {"content": SUMMARY, "finish_reason": "function_call"},
        {"content": SUMMARY, "finish_reason": None},
    ],
    ids=[
        "content_filter",
        "length",
        "refusal-with-text",
        "refusal",
        "tool_calls",
        "tool-call-said-stop",
        "function-call-said-stop",
        "function_call",
        "no-finish-reason",
    ],
)
def test_only_a_completion_that_finished_is_ever_stored_as_the_summary(
    llm: ScriptedLLMServer, make_thread: Any, answer: dict[str, Any]
) -> None:
    llm.answer = lambda body: answer
    thread = make_thread(settings_for(llm))
    thread.play(5)
    out = thread.fold()
    assert "Zanzibar" not in thread.summary()
    if out.status == "folded":  # the provider's verdict: the LLM-free fold at once
        assert out.prompt == LLM_FREE_LABEL and out.fallback.startswith("not retryable")
    else:  # a failed attempt, with its error (no content) for the event
        assert out.status == "failed" and thread.summary() == ""
        assert out.error and "Zanzibar" not in out.error


def _echoes(body: dict[str, Any]) -> dict[str, str]:
    user = prompt_texts(body)[-1]
    conversation = user.split("<conversation>\n", 1)[1].split("\n</conversation>", 1)[0]
    return {
        "prompt": user,
        "system-and-prompt": "\n\n".join(prompt_texts(body)),
        "first-line": user.splitlines()[0] + "\n" + SUMMARY,
        "conversation": conversation,
        "conversation-and-summary": SUMMARY + "\n\n" + conversation,
    }


@pytest.mark.parametrize(
    "echo",
    ["prompt", "system-and-prompt", "first-line", "conversation", "conversation-and-summary"],
)
def test_an_answer_that_echoes_its_prompt_is_never_stored_as_the_summary(
    llm: ScriptedLLMServer, make_thread: Any, echo: str
) -> None:
    llm.answer = lambda body: {"content": _echoes(body)[echo]}
    thread = make_thread(settings_for(llm, memory_summary_max_tokens=1500))
    thread.play(5)
    out = thread.fold()
    assert (out.status, thread.summary()) == ("failed", "")
    assert "echoed its prompt" in (out.error or "")


def test_an_echo_of_a_managed_prompt_is_recognised_from_what_was_sent() -> None:
    """A Langfuse prompt has other words than the built-in one: the check reads the messages."""
    from memory_core.fold.prompts import prompt_echo  # (new in this change: imported here)

    template = "You are a meticulous note taker for analysts. Fold these notes into the memo: "
    values = ("(none yet)", "User: Revenue by region for 2025\nAssistant: EMEA leads.", "-")
    messages = [{"role": "user", "content": template + values[1]}]
    assert prompt_echo(template + "\nThe user studies revenue.", messages, values)
    assert prompt_echo(values[1], messages, values)
    assert prompt_echo("The user studies revenue by region for 2025.", messages, values) is None


def _prose(tokens: int) -> list[str]:
    lines: list[str] = []
    while count_tokens("\n".join(lines)) < tokens:
        n = len(lines)
        lines.append(f"- Turn {n}: the user compared revenue of region R{n} against plan.")
    return lines[:-1]


def test_restored_instructions_survive_the_bound_when_the_model_lists_them_last(
    llm: ScriptedLLMServer, make_thread: Any
) -> None:
    bound = 200
    body = ["Goals:", *_prose(bound - 20)]
    answer = "\n".join([*body, "", INSTRUCTIONS_HEADER, "- Exclude test accounts from all figures"])
    assert count_tokens(answer) <= bound  # a valid answer: it is the restoring that overflows
    llm.answer = lambda _: {"content": answer}
    thread = make_thread(settings_for(llm, memory_summary_max_tokens=bound))
    thread.play(5)
    assert thread.fold().instructions_restored == 2
    stored = thread.summary()
    assert parse_sections(stored)["instructions"] == [
        "Exclude test accounts from all figures",
        "Show amounts in EUR from now on",
        "Use fiscal quarters that start in April",
    ]
    assert count_tokens(stored) <= bound
    whole = {line.strip() for line in answer.splitlines()}
    whole |= {"- Show amounts in EUR from now on", "- Use fiscal quarters that start in April"}
    assert [line for line in stored.splitlines() if line.strip() not in whole] == []


def test_what_code_knows_to_be_in_force_wins_over_the_models_paraphrase(
    llm: ScriptedLLMServer, make_thread: Any
) -> None:
    answers = iter(
        [
            "Standing instructions:\n- From now on, exclude test accounts\n\nGoals:\n- Revenue",
            # Turn 4 took the exclusion back; the model keeps it in its own words.
            "Standing instructions:\n- Test accounts are excluded\n\nGoals:\n- Revenue by region",
        ]
    )
    llm.answer = lambda _: {"content": next(answers)}
    thread = make_thread(settings_for(llm))
    thread.play(5, {1: SETUP[1], 4: SETUP[4]})  # the fold at turn 5 folds turns 1-3
    assert thread.fold().status == "folded"
    thread.play(8, {})
    out = thread.fold()
    assert (out.status, out.superseded_dropped, out.instructions_restored) == ("folded", 1, 1)
    [current] = detect(SETUP[4])
    assert parse_sections(thread.summary())["instructions"] == [current.text]
    assert "excluded" not in thread.summary()
