"""`agent-memory eval fidelity`: the corpus, the scoring, and a smoke run through a real worker.

The corpus tests keep the scenarios honest: a probe that cannot match, a trap question that a
probe would count as the instruction, or a replaced instruction still stated after it was
replaced would turn the eval's figures into artefacts of the corpus.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.eval import SCENARIOS, corpus
from memory_core.eval.corpus import TAIL_TURNS, Conversation, Fact, Scenario, turn_text
from memory_core.eval.filler import Script
from memory_core.eval.report import aggregates, markdown, overall, table_rows
from memory_core.eval.scoring import current_lines, probe_matches, score_view
from memory_core.fold.prompts import BUILTIN_LABEL
from memory_core.fold.summary_tail import stored_summary_bound
from tests.support import REPO

CONVERSATIONS = corpus()
IDS = [c.name for c in CONVERSATIONS]
# Round 1 was tuned on from the start; rounds 2 and 3 were written held-out and tuned on since.
TUNING = [s for s in SCENARIOS if not s.holdout]
HELD_OUT = [s for s in SCENARIOS if s.holdout]
SMOKE_TIMEOUT_S = 240


def _lines(conv: Conversation, start: int) -> list[tuple[int, str]]:
    """(turn, line) of every question, answer and SQL line from turn `start` on."""
    return [
        (n, line)
        for n, turn in enumerate(conv.turns[start - 1 :], start)
        for line in turn_text(turn).splitlines()
    ]


# ---------------------------------------------------------------- the corpus


def test_the_corpus_has_twenty_four_tuning_then_fourteen_held_out_conversations() -> None:
    assert len(set(IDS)) == len(IDS) == 38
    tuning = [c for c in CONVERSATIONS if not c.holdout]
    held_out = [c for c in CONVERSATIONS if c.holdout]
    assert (len(tuning), len(held_out)) == (24, 14)
    assert list(CONVERSATIONS) == tuning + held_out  # `--limit N` takes the tuning set first
    assert [c.name for c in tuning] == [s.name for s in TUNING]
    assert [c.name for c in held_out] == [s.name for s in HELD_OUT]
    lengths = [len(c.turns) for c in CONVERSATIONS]
    assert all(40 <= n <= 120 for n in lengths) and len(set(lengths)) == len(lengths)
    rounds = sorted({s.round for s in TUNING})
    assert rounds == [1, 2, 3] and [s.round for s in HELD_OUT] == [4] * 6 + [5] * 8
    assert [s.round for s in TUNING] == sorted(s.round for s in TUNING)  # round by round
    groups = [[c for c, s in zip(tuning, TUNING, strict=True) if s.round == r] for r in rounds]
    assert [len(g) for g in groups] == [12, 6, 6]
    held = [[c for c, s in zip(held_out, HELD_OUT, strict=True) if s.round == r] for r in (4, 5)]
    for group in (*groups, *held):  # each round shortest first
        assert [len(c.turns) for c in group] == sorted(len(c.turns) for c in group)
    assert sum(len(c.superseded) for c in CONVERSATIONS) >= 12
    with_sql = sum(bool(t.sql) for c in CONVERSATIONS for t in c.turns)
    assert with_sql > 0.4 * sum(lengths)


@pytest.mark.parametrize("scenario", HELD_OUT, ids=[s.name for s in HELD_OUT])
def test_a_held_out_conversation_is_shaped_like_the_tuning_set(scenario: Scenario) -> None:
    assert 45 <= scenario.turns <= 110
    originals = [s for s in scenario.says if not s.replaces]
    assert 5 <= len(originals) <= 9 and len(scenario.says) <= 9
    assert 2 <= sum(bool(s.replaces) for s in scenario.says) <= 3


def test_held_out_instructions_are_worded_anew() -> None:
    """No held-out message or answer repeats one of the tuning set (rounds 1 to 3)."""
    tuning = {t for s in TUNING for say in s.says for t in (say.query, say.answer)}
    for scenario in HELD_OUT:
        for say in scenario.says:
            assert say.query not in tuning and say.answer not in tuning, say.fact


def test_the_corpus_is_deterministic() -> None:
    assert tuple(Script(s).build() for s in SCENARIOS) == CONVERSATIONS


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=IDS)
def test_facts_are_set_and_replaced_where_the_summary_must_carry_them(conv: Conversation) -> None:
    n = len(conv.turns)
    assert len({f.id for f in conv.facts}) == len(conv.facts)
    for fact in conv.facts:
        assert 2 <= fact.set_turn <= n - TAIL_TURNS, fact.id
        if fact.kind == "superseded":
            assert fact.superseded_turn is not None, fact.id
            # well before the end: neither the old wording nor SQL applying it is still among
            # the unfolded turns or the summary's verbatim artifact tail
            assert fact.set_turn < fact.superseded_turn <= n - 25, fact.id
        else:
            assert fact.superseded_turn is None, fact.id
    assert any(f.set_turn <= n // 3 for f in conv.facts)  # early
    assert any(n // 3 < f.set_turn <= n - 20 for f in conv.facts)  # mid-way


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=IDS)
def test_every_probe_compiles_and_matches_the_turn_that_sets_it(conv: Conversation) -> None:
    for fact in conv.facts:
        re.compile(fact.probe)
        assert probe_matches(fact.probe, turn_text(conv.turns[fact.set_turn - 1])), fact.id


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=IDS)
def test_no_other_question_or_answer_states_an_instruction(conv: Conversation) -> None:
    """Filler, trap and tail turns never match a probe in words (SQL may apply one)."""
    setting = {f.set_turn for f in conv.facts}
    for n, turn in enumerate(conv.turns, 1):
        if n in setting:
            continue
        for fact in conv.facts:
            for said in (turn.user_query, turn.answer):
                assert not probe_matches(fact.probe, said), (fact.id, n, said)


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=IDS)
def test_the_last_turns_restate_nothing(conv: Conversation) -> None:
    start = len(conv.turns) - TAIL_TURNS + 1
    for fact in conv.established:
        hits = [(n, line) for n, line in _lines(conv, start) if probe_matches(fact.probe, line)]
        assert hits == [], fact.id


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=IDS)
def test_a_replaced_instruction_is_never_current_after_its_replacement(
    conv: Conversation,
) -> None:
    for fact in conv.superseded:
        assert fact.superseded_turn is not None
        lines = _lines(conv, fact.superseded_turn)
        assert [(n, x) for n, x in lines if current_lines(fact.probe, x)] == [], fact.id


# ---------------------------------------------------------------- scoring

FACTS = (
    Fact("no-test", "established", 2, r"leave\W+out\W+test\W+accounts|NOT\s+c\.is_test\b"),
    Fact("eur", "superseded", 3, r"amounts?\W+in\W+EUR\b", superseded_turn=9),
    Fact("fiscal", "established", 4, r"fiscal\W+quarters?.{0,40}april"),
)
CONV = Conversation("unit", (), FACTS)


def test_a_probe_matching_the_view_keeps_the_fact() -> None:
    view = "Conversation summary:\n  Standing instructions:\n  - Leave out test accounts\n"
    score = score_view(CONV, view)
    assert score.kept == ["no-test"] and score.missed == ["fiscal"]
    sql = "SQL:\n  SELECT 1\n  FROM orders o\n  WHERE NOT c.is_test\n"  # applied in SQL
    assert score_view(CONV, sql).kept == ["no-test"]


@pytest.mark.parametrize(
    "line",
    [
        "  - Show amounts in USD (previously: amounts in EUR)",
        "  - Amounts in EUR no longer apply; use USD",
        "  - Use USD instead of amounts in EUR",
        "  - Amounts in EUR: superseded by USD",
        "  - We used to show amounts in EUR",
        "  - Amounts in EUR were replaced by USD",
    ],
)
def test_a_superseded_probe_on_a_marked_line_is_not_current(line: str) -> None:
    assert score_view(CONV, f"Standing instructions:\n{line}\n").current == []


def test_a_superseded_probe_on_an_unmarked_line_is_current() -> None:
    view = "Standing instructions:\n  - Show amounts in USD\n  - Show amounts in EUR\n"
    assert score_view(CONV, view).current == ["eur"]
    assert current_lines(FACTS[1].probe, view) == ["  - Show amounts in EUR"]


def _row(i: int, *, holdout: bool) -> dict[str, Any]:
    return {
        "name": f"c{i}",
        "holdout": holdout,
        "turns": 40 + i,
        "last_seq": 40 + i,
        "folds": 2,
        "fold_failures": 0,
        "summary_tokens": 300 + i,
        "summary_bound": 2268,
        "established": 4,
        "kept": {"brief": 4 - i, "sql": 4, "both": 4 - i},
        "kept_in_summary_text": 3,
        "superseded": 2,
        "wrongly_current": {"brief": i, "sql": 0},
        "round": 4 if holdout else 1,
        "per_question": 3 * i,
        "false_standing": ["top-n"] if i == 1 else [],
    }


def _report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "summaries": "LLM-free fold",
        "summary_prompts": ["llm-free:v1"],
        "summary_bound": 2268,
        "summary_max_tokens": 1500,
        "view_max_tokens": 2000,
        "conversations": rows,
        **aggregates(rows),
    }


def test_the_report_adds_up() -> None:
    rows = [_row(i, holdout=False) for i in (0, 1)]
    total = overall(rows)
    assert total["kept_pct"] == {"brief": 87.5, "sql": 100.0, "both": 87.5}
    assert total["wrongly_current_pct"] == {"brief": 25.0, "sql": 0.0}
    assert total["all_summaries_within_bound"] and total["all_reached_last_turn"]
    report = _report(rows)
    assert report["tuning"] == report["overall"] == total
    assert report["holdout"]["conversations"] == 0
    table = table_rows(report)
    assert [r[0] for r in table] == ["c0", "c1", "tuning (2)", "overall (2)"]  # no empty set
    assert table[-1][4] == "7/8 (87.5%)"
    assert table[-1][7] == "6/8 (75.0%)"  # kept in the summary's own text
    assert "| **overall (2)** |" in markdown(report)


def test_the_report_gives_tuning_held_out_and_overall() -> None:
    rows = [_row(0, holdout=False), _row(1, holdout=False), _row(3, holdout=True)]
    report = _report(rows)
    assert [report[k]["conversations"] for k in ("tuning", "holdout", "overall")] == [2, 1, 3]
    assert report["holdout"]["kept"] == {"brief": 1, "sql": 4, "both": 1}
    assert report["holdout"]["wrongly_current_pct"] == {"brief": 150.0, "sql": 0.0}
    assert report["overall"]["established"] == 12 and report["tuning"]["established"] == 8
    table = table_rows(report)
    assert [r[0] for r in table[-3:]] == ["tuning (2)", "held-out (1)", "overall (3)"]
    assert table[-2][4] == "1/4 (25.0%)" and table[-1][4] == "8/12 (66.7%)"
    md = markdown(report)
    for label in ("tuning (2)", "held-out (1)", "overall (3)"):
        assert f"| **{label}** |" in md
    assert len(re.findall(r"^\| c\d \|", md, re.MULTILINE)) == 3  # conversation rows stay plain
    assert json.loads(json.dumps(report))["holdout"] == report["holdout"]


# ---------------------------------------------------------------- through the command


def _eval(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`agent-memory eval fidelity ARGS` on this session's services (conftest's env), offline."""
    full = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO), **env}
    for key in ("MEMORY_SUMMARY_MAX_TOKENS", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        if key not in env:
            full.pop(key, None)
    return subprocess.run(
        [sys.executable, "-m", "memory_core.cli", "eval", "fidelity", *args],
        cwd=tmp_path,  # its .agent-memory/eval (worker logs) lands in tmp_path
        env=full,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
        check=False,
    )


def test_an_unreachable_broker_is_one_line_and_exit_1(tmp_path: Path) -> None:
    proc = _eval(tmp_path, "--limit", "1", "--json", CELERY_BROKER_URL="redis://127.0.0.1:1/0")
    assert proc.returncode == 1 and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: eval failed: cannot reach the broker at redis://127.0.0.1:1/0")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.workers  # the eval command starts one
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 60)
def test_a_smoke_run_through_the_real_cli(tmp_path: Path, broker: str) -> None:
    """Two conversations through a real worker on this session's services (conftest's env);
    `broker` empties the session's broker db: the run uses only an empty one."""
    proc = _eval(tmp_path, "--limit", "2", "--json")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout)  # stdout is the report alone
    assert report["summaries"] == "LLM-free fold"
    assert report["summary_prompts"] and report["summary_prompts"][0].startswith("llm-free")
    assert report["summary_bound"] == stored_summary_bound(1500)
    rows = report["conversations"]
    assert [r["name"] for r in rows] == IDS[:2]
    for row, conv in zip(rows, CONVERSATIONS[:2], strict=True):
        assert row["last_seq"] == row["turns"] == len(conv.turns)
        assert row["folds"] >= 1 and row["fold_failures"] == 0
        assert row["summary_through_seq"] > 0
        assert 0 < row["summary_tokens"] <= row["summary_bound"]
        assert row["established"] == len(conv.established)
        assert row["superseded"] == len(conv.superseded)
        for focus in ("brief", "sql"):
            assert 0 <= row["kept"][focus] <= row["established"]
            assert 0 <= row["wrongly_current"][focus] <= row["superseded"]
            assert 0 < row["view_tokens"][focus] <= report["view_max_tokens"]
            assert len(row["missed"][focus]) == row["established"] - row["kept"][focus]
    total = report["overall"]
    assert total["conversations"] == 2 and total["turns"] == sum(r["turns"] for r in rows)
    assert report["tuning"] == total and report["holdout"]["conversations"] == 0
    assert not any(r["holdout"] for r in rows)
    assert total["all_reached_last_turn"] and total["all_summaries_within_bound"]
    assert "playing 2 conversations" in proc.stderr
    assert re.search(r"stopped worker demo-eval-\w+-1 \(exit code 0\)", proc.stderr)
    assert not list((tmp_path / ".agent-memory" / "eval").glob("worker-*.log"))


@pytest.mark.slow
@pytest.mark.workers  # the eval command starts one
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 60)
def test_agents_that_declare_keep_every_instruction_and_none_replaced(
    tmp_path: Path, broker: str
) -> None:
    """`--declared`: every turn's snapshot carries standing_instructions through the real
    worker; the code keeps each in force verbatim and none it replaced (its guarantee)."""
    proc = _eval(tmp_path, "--limit", "2", "--declared", "--json")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout)
    assert report["instructions"] == "declared by the agent"
    total = report["overall"]
    assert total["kept"] == {k: total["established"] for k in ("brief", "sql", "both")}
    assert total["superseded"] > 0 and total["wrongly_current"] == {"brief": 0, "sql": 0}
    assert total["per_question"] > 0 and total["false_standing"] == 0
    assert total["all_reached_last_turn"] and total["all_summaries_within_bound"]


def test_a_declaring_agent_sends_every_instruction_under_one_subject_per_chain() -> None:
    """The corpus as agents that declare send it: one entry per instruction of the message,
    its subject shared with the instructions it replaces, an empty list elsewhere."""
    from memory_core.eval import corpus as build

    for plain, said in zip(CONVERSATIONS, build(None, True), strict=True):
        assert [t.user_query for t in plain.turns] == [t.user_query for t in said.turns]
        by_turn = {f.set_turn: f for f in said.facts}
        for n, t in enumerate(said.turns, 1):
            assert t.standing_instructions is not None
            assert bool(t.standing_instructions) == (n in by_turn), (said.name, n)
        subjects = {
            f.id: t.standing_instructions[0]["subject"]
            for f in said.facts
            for t in [said.turns[f.set_turn - 1]]
            if t.standing_instructions and len(t.standing_instructions) == 1
        }
        for f in said.superseded:
            later = [g for g in said.facts if g.set_turn == f.superseded_turn]
            if f.id in subjects and len(later) == 1 and later[0].id in subjects:
                assert subjects[f.id] == subjects[later[0].id], (said.name, f.id)


@pytest.mark.slow
@pytest.mark.workers  # the eval command starts one
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 60)
def test_with_an_llm_the_report_says_so(tmp_path: Path, llm: FakeLLMServer, broker: str) -> None:
    """OPENAI_BASE_URL set: the worker folds with the LLM (here the fake one), same report."""
    keys = dict(OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="sk-test")
    proc = _eval(tmp_path, "--limit", "1", "--json", LANGFUSE_PUBLIC_KEY="", **keys)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout)
    assert report["summaries"].startswith("LLM ")
    assert report["summaries"].endswith(f" at {llm.base_url}")
    assert report["summary_prompts"] == [BUILTIN_LABEL]
    assert llm.calls >= report["overall"]["folds"] >= 1
    assert report["overall"]["all_summaries_within_bound"]


def test_a_per_question_choice_counts_as_false_standing_only_in_the_standing_section() -> None:
    from memory_core.eval.corpus import Conversation
    from memory_core.eval.scoring import score_view

    probes = (("period:quarter", r"date_trunc\('quarter',[^)]*\)\s*="), ("top-n", r"\bLIMIT\s+\d"))
    conv = Conversation("c", (), (), per_question=probes)
    line = "- Applied in SQL: date_trunc('quarter', o.ts) = DATE '2024-07-01'"
    standing = f"Conversation summary:\n  Standing instructions:\n  {line}\n\n  Goals:\n  - x"
    elsewhere = f"Conversation summary:\n  Query filters:\n  {line}\nSQL: ... LIMIT 5"
    assert score_view(conv, standing).false_standing == ["period:quarter"]
    assert score_view(conv, elsewhere).false_standing == []


def test_choice_questions_vary_their_values_quarters_and_top_n() -> None:
    import dataclasses

    from memory_core.eval.corpus import Choice
    from memory_core.eval.filler import Script

    sc = TUNING[0]
    choice = Choice("product line", "p.product_line", ("Laptops", "Phones", "Tablets"))
    conv = Script(
        dataclasses.replace(sc, domain=dataclasses.replace(sc.domain, choices=(choice,)))
    ).build()
    picked = [t.sql[0] for t in conv.turns if t.sql and "p.product_line = '" in t.sql[0]]
    assert len(picked) >= 5
    assert len({re.search(r"p\.product_line = '(\w+)'", q)[1] for q in picked}) > 1  # type: ignore[index]
    assert len({re.search(r"LIMIT (\d+)", q)[1] for q in picked}) > 1  # type: ignore[index]
    assert {pid for pid, _ in conv.per_question} == {
        "choice:product line",
        "period:quarter",
        "top-n",
    }


def test_a_choice_question_gets_follow_ups_that_keep_its_picks_for_at_most_three_queries() -> None:
    """Follow-ups keep a choice's value and quarter for a few queries in a row: what the rule
    that promotes a WHERE condition from SQL alone must outlast (SQL_STANDING_QUERIES)."""
    from memory_core.eval.filler import MAX_FOLLOW_UPS
    from memory_core.instructions.standing import SQL_STANDING_QUERIES

    runs: list[int] = []
    for conv in CONVERSATIONS:
        picks = [
            m.group(0)
            if (m := re.search(r"date_trunc\('quarter', [^)]*\) = DATE '[\d-]+'", q))
            else None
            for t in conv.turns
            for q in t.sql[:1]
        ]
        run, prev = 0, None
        for cur in [*picks, None]:
            if run and cur != prev:
                runs.append(run)
            run = run + 1 if cur is not None and cur == prev else int(cur is not None)
            prev = cur
    assert max(runs) == 1 + MAX_FOLLOW_UPS < SQL_STANDING_QUERIES
    assert sum(r > 1 for r in runs) >= 20


def test_held_out_files_phrase_their_choices_apart() -> None:
    from memory_core.eval.filler import CHOICE_QUESTIONS, HELD_OUT_CHOICE_QUESTIONS

    def starts(templates: tuple[str, ...]) -> set[str]:
        return {t.split("{")[0] for t in templates}

    held = [t.user_query for c in CONVERSATIONS if c.holdout and c.per_question for t in c.turns]
    tuned = [t.user_query for c in CONVERSATIONS if not c.holdout for t in c.turns]
    assert any("for this one" in q for q in held)
    assert not any("for this one" in q for q in tuned)
    assert not starts(CHOICE_QUESTIONS) & starts(HELD_OUT_CHOICE_QUESTIONS) - {""}
