"""What the LLM answers, drawn by hypothesis: real folds against a model that answers anything.

Each example is a thread whose user sets standing instructions in the turns of its first fold
and takes some back in those of its second. Every fold attempt is answered by a completion
drawn from a grammar (tests/support/scripted_llm.py serves it): a summary whose sections come
in any order or not at all, whose instructions section lists the ones in force in the user's
words or others, drops them, keeps superseded ones in the model's own words, contradicts them
or names instructions never given, padded up to the bound, in other scripts; or no summary at
all: another finish reason, a refusal, a tool call, the prompt echoed back, empty, symbols,
an apology, an answer over the bound. The folds run in-process (`Folder.fold`) on real
Postgres and Redis, at most two LLM attempts each.

Invariants after every attempt:
* a non-summary is never stored: that attempt failed (the summary is unchanged) or the fold
  is LLM-free; a summary is accepted;
* every instruction in force is in the stored section (in the user's words or the model's);
* nothing superseded reads as current (no line says it, in its words or a paraphrase);
* the bounds hold (the LLM text, the stored summary with its artifact tail);
* no half lines: every line of a stored LLM summary is a whole line of what the model
  answered, or an instruction restored whole.

The short run is deterministic; the long run:
`LLM_ANSWERS_EXAMPLES=1000 make test PYTEST_ARGS="tests/test_llm_answers_hostile.py"`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.fold.folding import Folder, FoldOutcome
from memory_core.fold.llm_free import INSTRUCTIONS_HEADER, LLM_FREE_LABEL, parse_sections
from memory_core.fold.prompts import BUILTIN_LABEL, BUILTIN_USER
from memory_core.fold.summarizer import ConversationSummarizer, storable
from memory_core.fold.summary_tail import stored_summary_bound, strip_artifact_tail
from memory_core.instructions.detect import detect
from memory_core.settings import Settings
from memory_core.tokens import count_tokens
from tests.support.scripted_llm import ScriptedLLMServer, prompt_texts
from tests.support.snapshots import make_snapshot

BOUND = 250  # MEMORY_SUMMARY_MAX_TOKENS of every example


@dataclass(frozen=True)
class Subject:
    """An instruction the user sets (`first`) and later takes back (`then`), as detect()
    words them, with what a model might write for each."""

    first: str
    then: str
    says_first: tuple[str, ...]
    says_then: tuple[str, ...]

    def says(self, superseded: bool) -> tuple[str, ...]:
        return (self.then, *self.says_then) if superseded else (self.first, *self.says_first)


POOL = (
    Subject(
        "From now on, exclude test accounts",
        "Include test accounts again",
        (
            "Test accounts are excluded",
            "No test accounts",
            "Exclude test accounts from all figures",
        ),
        ("Test accounts are included again", "Test accounts count again"),
    ),
    Subject(
        "Show amounts in EUR from now on",
        "Switch to USD from now on",
        ("Amounts are in EUR", "All amounts are shown in EUR"),
        ("Amounts are in USD", "All amounts are shown in USD"),
    ),
    Subject(
        "Use fiscal quarters that start in April",
        "Switch back to calendar quarters",
        ("Quarters are fiscal, starting in April", "Fiscal quarters starting in April"),
        ("Calendar quarters are used", "Quarters follow the calendar year"),
    ),
    Subject(
        "An active customer is one with an order in the last 90 days",
        "An active customer is one with an order in the last 30 days",
        ("Active customers ordered within the last 90 days",),
        ("Active customers ordered within the last 30 days",),
    ),
    Subject(
        "Only the Nordics from now on",
        "All regions again",
        ("Only Nordic countries are in scope", "Scope: the Nordics only"),
        ("All regions are in scope", "Every region counts"),
    ),
)
NEVER_GIVEN = ("Round all figures to millions", "Exclude internal users", "Weeks start on Sunday")
PROSE = (
    "The user compares revenue by region quarter over quarter.",
    "Built the chart Revenue by region (column) and the dashboard Sales.",
    "The analysis moved from revenue to churn of enterprise accounts.",
    "Open question: whether returns should count against the regional targets.",
)
SCRIPTS = (
    "Umsatz nach Region für 2025, Überblick über die Quartale.",
    "売上を地域別に分析し、四半期ごとに比較しました。",
    "Ανάλυση εσόδων ανά περιοχή και τρίμηνο.",
    "Выручка по регионам за квартал растёт.",
    "مراجعة الإيرادات حسب المنطقة لكل ربع سنة",
    "📈 Revenue trend is up in every region 📈",
)
TEMPLATE_LINES = tuple(
    line for line in BUILTIN_USER.splitlines() if "{" not in line and len(line.split()) >= 8
)
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
HEADERS = ("Standing instructions:", "**Standing instructions:**", "## Standing instructions:")


@dataclass
class World:
    """A thread's scenario: which subjects it sets at which turn, what is in force when."""

    subjects: list[Subject]
    taken_back: list[bool]

    def queries(self) -> dict[int, str]:
        """Turns 1-3 set the instructions (the first fold's), turns 4-6 take some back."""
        out = {n: f"Which product sold best in month {n}?" for n in range(1, 9)}
        for i, s in enumerate(self.subjects):
            out[1 + i] = s.first + "."
            if self.taken_back[i]:
                out[4 + i] = "Actually, " + s.then[:1].lower() + s.then[1:] + "."
        return out

    def in_force(self, through: int) -> list[tuple[Subject, bool]]:
        """(subject, superseded?) of every instruction set in turns up to `through`."""
        return [
            (s, through >= 4 + i and t)
            for i, (s, t) in enumerate(zip(self.subjects, self.taken_back, strict=True))
        ]


@dataclass(frozen=True)
class Spec:
    """One drawn completion; the content of an echo is made from the prompt it answers."""

    kind: str  # "summary" (to be accepted) or what kind of non-summary it is
    fields: dict[str, Any]
    body: str
    echo: str | None = None

    def render(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.echo is None:
            return self.fields
        texts = prompt_texts(request)
        user = texts[-1]
        block = user.split("<conversation>\n", 1)[-1].split("\n</conversation>", 1)[0]
        content = {
            "prompt": user,
            "messages": "\n\n".join(texts),
            "block": block,
            "block+body": self.body + "\n\n" + block,
        }.get(self.echo, self.echo + "\n" + self.body)
        return {"content": content}


@st.composite
def summary_body(draw: st.DrawFn, world: World, through: int) -> str:
    """A summary in words: sections in any order, or missing, the instructions in any words."""
    items: list[str] = []
    for subject, superseded in world.in_force(through):
        choice = draw(st.sampled_from(["current", "current", "omit", "stale", "contradict"]))
        if choice == "current":
            items.append(draw(st.sampled_from(subject.says(superseded))))
        elif choice == "stale" and superseded:  # the model kept the old one, in some words
            items.append(draw(st.sampled_from(subject.says(False))))
        elif choice == "contradict":  # the other way round from what is in force
            items.append(draw(st.sampled_from(subject.says(not superseded))))
    items += draw(st.lists(st.sampled_from(NEVER_GIVEN), max_size=2, unique=True))
    items = draw(st.permutations(items))
    blank = "\n" if draw(st.booleans()) else ""
    parts = {
        "standing": draw(st.sampled_from(HEADERS)) + blank + "".join(f"\n- {i}" for i in items),
        "goals": "Goals:\n- Revenue by region\n- Churn of enterprise accounts",
        "prose": "\n".join(draw(st.lists(st.sampled_from(PROSE), min_size=1, max_size=3))),
        "scripts": "\n".join(draw(st.lists(st.sampled_from(SCRIPTS), max_size=3))),
    }
    order = draw(st.permutations(list(parts)))
    keep = [k for k in order if k in ("prose", "goals") or draw(st.integers(0, 4))]
    text = "\n\n".join(parts[k] for k in keep if parts[k])
    fill = draw(st.sampled_from([0.0, 0.0, 0.6, 0.9, 0.97, 1.3]))  # near the bound, or over
    n = 0
    while count_tokens(text) < fill * BOUND - 15:
        line = f"- Turn {n}: the user compared revenue of region R{n} against the plan."
        at = draw(st.integers(0, text.count("\n")))
        lines = text.split("\n")
        text = "\n".join([*lines[:at], line, *lines[at:]])
        n += 1
    if draw(st.integers(0, 5)) == 0:
        text = "Here is the updated summary:\n" + text
    return text


@st.composite
def completions(draw: st.DrawFn, world: World, through: int) -> Spec:  # noqa: PLR0911
    body = draw(summary_body(world, through))
    kind = draw(
        st.sampled_from(
            ["summary"] * 5 + ["finish", "refusal", "tool", "echo", "empty", "garbage", "apology"]
        )
    )
    if kind == "summary":
        cleaned = storable(body).removeprefix("Here is the updated summary:\n").strip()
        kind = "summary" if count_tokens(cleaned) <= BOUND else "over"
        return Spec(kind, {"content": body}, body)
    if kind == "finish":
        reason = draw(
            st.sampled_from(
                ["length", "content_filter", "tool_calls", "function_call", None, "eos"]
            )
        )
        return Spec(kind, {"content": body, "finish_reason": reason}, body)
    if kind == "refusal":
        content = draw(st.sampled_from([None, "", body]))
        return Spec(kind, {"content": content, "refusal": "I can't help with that."}, body)
    if kind == "tool":
        content = draw(st.sampled_from([None, body]))
        calls: list[dict[str, Any]] = [
            {"tool_calls": [TOOL_CALL]},
            {"function_call": TOOL_CALL["function"]},
        ]
        call = draw(st.sampled_from(calls))
        reason = draw(st.sampled_from(["stop", "tool_calls", "function_call"]))
        return Spec(kind, {"content": content, "finish_reason": reason} | call, body)
    if kind == "echo":
        lines = draw(st.lists(st.sampled_from(TEMPLATE_LINES), min_size=1, max_size=4))
        echo = draw(
            st.sampled_from(["prompt", "messages", "block", "block+body", "\n".join(lines)])
        )
        return Spec(kind, {}, body, echo)
    if kind == "empty":
        return Spec(kind, {"content": draw(st.sampled_from(["", "  \n\t ", None]))}, body)
    if kind == "garbage":
        junk = draw(st.text(alphabet="#$%^&*~0123456789 .:;-\n\ufffd", min_size=1, max_size=80))
        return Spec(kind, {"content": junk}, body)
    apology = draw(
        st.sampled_from(["I'm sorry, but I can't help with that.", "As an AI, I cannot"])
    )
    return Spec(kind, {"content": apology + " " + draw(st.sampled_from(["", body]))}, body)


@dataclass(repr=False)
class Served:
    """The completions queued for the next attempts, and those answered so far."""

    queue: list[Spec] = field(default_factory=list)
    answered: list[tuple[Spec, dict[str, Any]]] = field(default_factory=list)

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        spec = self.queue.pop(0)
        answer = spec.render(request)
        self.answered.append((spec, answer))
        return answer


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ScriptedLLMServer, Served]]:
    box = Served()
    with ScriptedLLMServer(box) as server:
        yield server, box


def _settings(server: ScriptedLLMServer) -> Settings:
    return Settings(
        _env_file=None,
        openai_base_url=server.base_url,
        openai_api_key="sk-test",
        langfuse_public_key=None,
        langfuse_secret_key=None,
        memory_llm_timeout_s=5.0,
        memory_compression_threshold=4,  # the fold at turn 5 folds 1-3, at turn 8 folds 4-6
        memory_max_recent_messages=2,
        memory_summary_max_tokens=BOUND,
        memory_fold_max_llm_attempts=2,
    )


def _line(text: str) -> str:
    return text.strip().lstrip("-*# ").rstrip("* ").strip().casefold()


def _check_fold(
    world: World, out: FoldOutcome, stored: str | None, allowed: set[str], answers: list[str]
) -> None:
    full = stored or ""
    text = strip_artifact_tail(full) or ""
    assert count_tokens(text) <= BOUND, count_tokens(text)
    assert count_tokens(full) <= stored_summary_bound(BOUND)
    section = {_line(i) for i in parse_sections(text)["instructions"]}
    lines = {_line(line) for line in text.splitlines()}
    for subject, superseded in world.in_force(out.through_seq or 0):
        said = {_line(t) for t in subject.says(superseded)}
        assert section & said, ("in force, not in the section", subject.says(superseded)[0], text)
        if superseded:
            stale = {_line(t) for t in subject.says(False)} & lines
            assert not stale, ("superseded, still there", stale, text)
    if out.prompt == BUILTIN_LABEL:  # no half lines: whole lines of answers, or restored
        whole = {_line(line) for a in answers for line in storable(a).splitlines()}
        halves = [line for line in text.splitlines() if _line(line) not in whole | allowed]
        assert not halves, ("half lines", halves, text)


@settings(
    max_examples=int(os.environ.get("LLM_ANSWERS_EXAMPLES", "60")),
    deadline=None,
    derandomize="LLM_ANSWERS_EXAMPLES" not in os.environ,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_no_answer_of_the_llm_breaks_the_stored_summary(
    data: st.DataObject,
    served: tuple[ScriptedLLMServer, Served],
    redis_client: redis.Redis,
) -> None:
    server, box = served
    chosen = data.draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=3, unique=True))
    world = World(
        chosen, data.draw(st.lists(st.booleans(), min_size=len(chosen), max_size=len(chosen)))
    )
    memory = RedisConversationMemory(redis_client, settings=_settings(server))
    folder = Folder(memory, ConversationSummarizer(_settings(server)))
    tid, queries = uuid.uuid4(), world.queries()
    allowed = {_line(t) for s in POOL for t in (*s.says(False), *s.says(True))}
    allowed |= {_line(t) for t in NEVER_GIVEN} | {_line(INSTRUCTIONS_HEADER)}
    answers: list[str] = []
    saved = 0
    for upto, through in ((5, 3), (8, 6)):
        for n in range(saved + 1, upto + 1):
            snap = make_snapshot(tid, n, sql=[], user_query=queries[n])
            assert save_session_to_thread_safe(snap, memory=memory).ok
        saved = upto
        box.queue = [data.draw(completions(world, through)) for _ in range(2)]
        for _attempt in range(2):
            before = memory.get_context(tid, "user-42").summary
            box.answered.clear()
            out = folder.fold(tid)
            [(spec, answer)] = box.answered  # every attempt asks the LLM
            stored = memory.get_context(tid, "user-42").summary
            if isinstance(answer.get("content"), str):
                answers.append(answer["content"])
            if spec.kind != "summary":  # never stored
                assert out.status == "failed" or out.prompt == LLM_FREE_LABEL, (spec.kind, answer)
                if out.status == "failed":
                    assert stored == before
            else:  # a summary is a summary
                assert (out.status, out.prompt) == ("folded", BUILTIN_LABEL), (out, answer)
            if out.status == "folded":
                _check_fold(world, out, stored, allowed, answers)
                break
        assert out.status == "folded", out


def test_the_pool_is_worded_as_detection_words_it() -> None:
    """The generator's instructions are what code finds in the user's turns, word for word."""
    for subject in POOL:
        world = World([subject], [True])
        assert [i.text for i in detect(world.queries()[1])] == [subject.first]
        assert [i.text for i in detect(world.queries()[4])] == [subject.then]
