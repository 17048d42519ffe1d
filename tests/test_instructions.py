"""Standing instructions: detection, keys, supersession, and their section in the LLM-free fold."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_core.copy.context import Exchange
from memory_core.fold.llm_free import INSTRUCTIONS_HEADER, llm_free_fold, parse_sections
from memory_core.instructions.detect import detect, key_of
from memory_core.instructions.sql_conditions import sql_conditions
from memory_core.tokens import count_tokens
from memory_core.write.artifacts import derive_artifacts


def turn(seq: int, query: str, sql: tuple[str, ...] = ()) -> Exchange:
    return Exchange(
        seq=seq,
        session_id=uuid.UUID(int=seq),
        user_query=query,
        answer="Done.",
        artifacts=derive_artifacts(sql, (), ()),
        completed_at=datetime(2026, 12, 1, tzinfo=UTC),
    )


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ("Leave out test accounts.", "filter:test account"),
        ("Can you exclude internal users from everything?", "filter:internal user"),
        ("Ignore refunds going forward", "filter:refund"),
        ("An active customer is one with an order in the last 90 days", "define:active customer"),
        ("By churned we mean no login for 60 days.", "define:churned"),
        ("Only the Nordics from now on.", "scope:region"),
        ("Let's focus on enterprise plans.", "scope:segment"),
        ("Use fiscal quarters that start in April", "calendar"),
        ("Show amounts in EUR please", "currency"),
        ("All timestamps in UTC please", "timezone"),
        ("Round to thousands.", "number format"),
        ("Call it GMV, not revenue.", "naming"),
        ("Always use bar charts from now on", "chart style"),
    ],
)
def test_instructions_phrased_many_ways_are_found_with_their_key(query: str, key: str) -> None:
    found = detect(query)
    assert [i.key for i in found] == [key]
    assert key_of(found[0].text) == key  # a summary read back gives the same key


@pytest.mark.parametrize(
    "query",
    [
        "What would revenue be in USD?",  # a question asks once
        "Which region had the highest revenue last quarter?",
        "Make that a bar chart",  # changes one chart
        "Now break that down by region",
        "Show revenue by month for 2025",
        "Thanks, that looks great!",
    ],
)
def test_questions_and_one_off_requests_set_no_instruction(query: str) -> None:
    assert detect(query) == []


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("Leave out test accounts.", "Actually, include test accounts again."),
        ("Use fiscal quarters that start in April.", "Switch back to calendar quarters."),
        ("Show amounts in EUR.", "Forget the EUR, use USD."),
        ("Only the Nordics from now on.", "Let's look at all regions again."),
        ("Drop refunds from everything.", "Stop excluding refunds."),
    ],
)
def test_a_later_instruction_supersedes_the_earlier_one(first: str, then: str) -> None:
    summary = llm_free_fold(None, [turn(1, first)], 500)
    assert first.rstrip(".") in summary
    after = llm_free_fold(summary, [turn(2, then)], 500)
    section = parse_sections(after)["instructions"]
    assert len(section) == 1 and first.rstrip(".") not in after
    assert key_of(section[0]) == detect(first)[0].key


def test_sql_conditions_held_four_queries_in_a_row_stand_and_a_revocation_drops_them() -> None:
    q = "SELECT region, SUM(x) FROM orders o JOIN accounts a ON a.id = o.aid WHERE NOT a.is_test"
    turns = [turn(n, "Revenue by region", (q + " GROUP BY 1",)) for n in (1, 2, 3)]
    turns.append(turn(4, "Top accounts", (q + " AND o.day BETWEEN 1 AND 5 ORDER BY 2",)))
    summary = llm_free_fold(None, turns, 500)
    sections = parse_sections(summary)
    assert "Applied in SQL: NOT a.is_test" in sections["instructions"]
    # seen once, with its count
    assert "Applied in SQL: o.day BETWEEN 1 AND 5 (1 query in a row)" in sections["seen"]
    after = llm_free_fold(summary, [turn(3, "Include test accounts again please.")], 500)
    assert "is_test" not in after  # neither the condition nor the old queries that applied it


def test_conjuncts_split_at_top_level_and_between_stays_whole() -> None:
    sql = "SELECT 1 FROM t WHERE a = 1 AND (b = 2 OR c = 3) AND d BETWEEN 1 AND 5 GROUP BY 1"
    assert [c.text for c in sql_conditions(sql)] == [
        "Applied in SQL: a = 1",
        "Applied in SQL: (b = 2 OR c = 3)",
        "Applied in SQL: d BETWEEN 1 AND 5",
    ]


def test_instructions_come_first_and_survive_every_fold_within_the_bound() -> None:
    rules = [
        "Leave out test accounts.",
        "Show amounts in EUR.",
        "An active customer is one with an order in the last 90 days.",
        "Use fiscal quarters that start in April.",
    ]
    summary: str | None = None
    seq = 0
    for fold in range(10):
        turns = []
        for _ in range(11):
            seq += 1
            query = rules[seq - 1] if seq <= len(rules) else f"Weekly orders for store {seq}?"
            turns.append(turn(seq, query, (f"SELECT * FROM o WHERE store = {seq} AND w > {fold}",)))
        summary = llm_free_fold(summary, turns, 300)
        assert count_tokens(summary) <= 300
        assert summary.startswith(INSTRUCTIONS_HEADER)
        for rule in rules:
            assert rule.rstrip(".") in summary, (fold, rule)


_SUBJECTS = st.sampled_from(["test accounts", "internal users", "refunds", "trial plans"])
_VERBS = st.sampled_from(["Leave out", "Exclude", "Ignore", "Drop", "Please remove"])
_TAILS = st.sampled_from(["", " from now on", " going forward", " from everything"])


@settings(max_examples=200, deadline=None)
@given(verb=_VERBS, subject=_SUBJECTS, tail=_TAILS, again=st.booleans())
def test_filter_keys_name_the_subject_and_reread_the_same(
    verb: str, subject: str, tail: str, again: bool
) -> None:
    query = f"{verb} {subject}{tail}."
    if again:
        query = f"Actually, include {subject} again."
    found = detect(query)
    assert len(found) == 1
    assert found[0].key == "filter:" + " ".join(w.rstrip("s") for w in subject.split())
    assert key_of(found[0].text) == found[0].key


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(range(6)), min_size=1, max_size=30), st.integers(80, 600))
def test_at_most_one_instruction_per_key_and_the_newest_wins(picks: list[int], bound: int) -> None:
    phrases = [
        "Show amounts in EUR.",
        "Report everything in USD from now on.",
        "Leave out test accounts.",
        "Include test accounts again.",
        "Use fiscal quarters that start in April.",
        "Switch back to calendar quarters.",
    ]
    summary: str | None = None
    for seq, pick in enumerate(picks, start=1):
        summary = llm_free_fold(summary, [turn(seq, phrases[pick])], bound)
        assert count_tokens(summary) <= bound
    section = parse_sections(summary)["instructions"]
    keys = [key_of(t) for t in section]
    assert len(keys) == len(set(keys))
    newest = {detect(phrases[p])[0].key: phrases[p].rstrip(".") for p in picks}
    for key, text in newest.items():
        assert not any(key_of(t) == key and t != text for t in section)


@pytest.mark.parametrize(
    ("query", "key", "text"),
    [
        # A clause carries the instruction; the whole sentence is what the summary shows.
        (
            "Thousands is too granular for the board deck - round to millions.",
            "number format",
            "Thousands is too granular for the board deck - round to millions",
        ),
        # A dot inside an address does not end the sentence.
        (
            "Exclude test bookings - anything made with a @test.travel email.",
            "filter:test booking",
            "Exclude test bookings - anything made with a @test.travel email",
        ),
        (
            "Change of plan: use Japan time for dates, the publisher sits in Tokyo.",
            "timezone",
            "Change of plan: use Japan time for dates, the publisher sits in Tokyo",
        ),
        (
            "A cancellation only counts if it happened more than 24 hours after booking.",
            "define:cancellation",
            "A cancellation only counts if it happened more than 24 hours after booking",
        ),
    ],
)
def test_instructions_inside_longer_sentences(query: str, key: str, text: str) -> None:
    assert [(i.key, i.text) for i in detect(query)] == [(key, text)]
    assert key_of(text) == key


def test_moving_a_chart_is_not_a_filter() -> None:
    assert detect("Drop that into the Summer Season dashboard.") == []


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("Ignore partner-sourced deals, another team books those.", "Put partner deals back in."),
        (
            "An active customer is one with an order in the last 90 days.",
            "Let's tighten that activity rule: ordered within the last 60 days.",
        ),
        ("Just the German warehouses for now.", "Add Poland to the warehouse scope."),
        ("Only tier 2 queues from now on.", "Widen it to tiers 1 and 2 together."),
        (
            "Let's focus on enterprise plans for now.",
            "Scratch the big-customer focus - bring all plans back in, self-serve too.",
        ),
        ("Only stores in the North region from now on.", "OK - back to global numbers."),
    ],
)
def test_a_replacement_worded_differently_still_supersedes(first: str, then: str) -> None:
    summary = llm_free_fold(None, [turn(1, first)], 500)
    after = llm_free_fold(summary, [turn(2, then)], 500)
    expected = then.rstrip(".").removeprefix("OK - ")
    assert parse_sections(after)["instructions"] == [expected[:1].upper() + expected[1:]]


def test_a_user_instruction_revokes_the_conditions_it_speaks_about() -> None:
    q = "SELECT COUNT(*) FROM bookings b JOIN customers c ON c.id = b.cid WHERE "
    where = "c.email NOT LIKE '%@test.travel' AND c.country IN ('DE', 'AT', 'CH')"
    turns = [turn(n, "Bookings by month", (q + where,)) for n in range(1, 5)]
    summary = llm_free_fold(None, turns, 500)
    assert len([i for i in parse_sections(summary)["instructions"] if "Applied" in i]) == 2
    # Its values name the test bookings; a region scope is about the country column.
    after = llm_free_fold(summary, [turn(3, "Actually, include test bookings again.")], 500)
    assert "@test.travel" not in after and "c.country IN" in after
    after = llm_free_fold(after, [turn(4, "Widen the scope to all of Europe.")], 500)
    assert "c.country IN" not in after


def test_a_condition_the_latest_queries_on_its_table_left_out_is_no_longer_standing() -> None:
    base = "SELECT COUNT(*) FROM orders o WHERE o.day > 1"
    applied = [turn(n, "Orders", (base + " AND NOT o.is_test",)) for n in (1, 2, 3, 4)]
    summary = llm_free_fold(None, applied, 500)
    assert "Applied in SQL: NOT o.is_test" in summary
    # Queries on another table say nothing about it; one query without it is not enough.
    other = [turn(3, "Users", ("SELECT COUNT(*) FROM users u WHERE u.age > 1",))]
    one = [turn(4, "Orders", (base,))]
    standing = "Applied in SQL: NOT o.is_test"
    assert standing in parse_sections(llm_free_fold(summary, other + one, 500))["instructions"]
    two = [turn(5, "Orders", (base,)), turn(6, "Orders", (base + " AND o.x = 1",))]
    assert standing not in parse_sections(llm_free_fold(summary, two, 500))["instructions"]


@pytest.mark.parametrize(
    ("query", "key"),
    [
        (
            "Time to hire runs from the day the req opens to the day the offer is signed.",
            "define:time hire",
        ),
        ("Loss ratio is incurred claims over earned premium, as a percent.", "define:loss ratio"),
        (
            "Active learner = at least one lesson finished in the past 14 days.",
            "define:active learner",
        ),
        ("A renewal up to 30 days after expiry still counts as retained.", "define:retained"),
        ("Report kWh, not MWh - the retail team thinks in kilowatt-hours.", "units"),
        ("Alberta and British Columbia come back in.", "scope:region"),
        ("Auditors should be counted again.", "filter:auditor"),
        ("Include pickup orders from here on.", "filter:pickup order"),
    ],
)
def test_definitions_units_and_take_backs_in_other_shapes(query: str, key: str) -> None:
    assert [i.key for i in detect(query)] == [key]


def test_two_instructions_in_one_sentence_are_two_lines() -> None:
    found = detect(
        "Two more rules: only the cohort courses, and nothing from the corporate academy."
    )
    assert [(i.key, i.text) for i in found] == [
        ("scope:cohort course", "Two more rules: only the cohort courses"),
        ("filter:corporate academy", "Nothing from the corporate academy"),
    ]
    # A dash or a colon adds a detail: still one instruction.
    assert len(detect("Scratch the big-customer focus - bring all plans back in.")) == 1


def test_an_instruction_goes_with_the_sql_condition_that_applied_it() -> None:
    q = "SELECT COUNT(*) FROM courses co WHERE co.mode = 'cohort'"
    turns = [turn(1, "Only the cohort courses from now on.", (q,)), turn(2, "Count", (q,))]
    summary = llm_free_fold(None, turns, 500)
    assert len(parse_sections(summary)["instructions"]) == 2
    # "delivery modes" names the condition's column; "cohort" links the user's instruction.
    after = llm_free_fold(summary, [turn(3, "Live courses are back, so all delivery modes.")], 500)
    assert parse_sections(after)["instructions"] == ["Live courses are back, so all delivery modes"]


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ("Finance wants weekly figures on ISO weeks now, Monday through Sunday.", "calendar"),
        ("The sponsor wants weeks that open on a Monday.", "calendar"),
        ("We call it a peak boarding when the tap is between 7 and 9.", "define:peak boarding"),
        ("The board redefined the rush: 6 to 10 in the morning.", "define:rush"),
        ("The 22:00-06:00 crew counts again.", "filter:crew"),
    ],
)
def test_wishes_redefinitions_and_counts_again(query: str, key: str) -> None:
    assert [i.key for i in detect(query)] == [key]


def test_a_take_back_named_differently_retires_what_the_queries_stopped_applying() -> None:
    """ "The crew counts again" shares no word with "the night shift is out"; the queries
    show which restriction it lifted: the condition they stopped applying after it."""
    with_filter = "SELECT COUNT(*) FROM inspections i WHERE i.day > 1 AND i.shift <> 'night'"
    without = "SELECT COUNT(*) FROM inspections i WHERE i.day > 1"
    before = [
        turn(1, "Going forward, the night shift is out.", (with_filter,)),
        turn(2, "Defects by line", (with_filter,)),
    ]
    summary = llm_free_fold(None, before, 500)
    assert "Going forward, the night shift is out" in parse_sections(summary)["instructions"]
    lifted = [
        turn(3, "The 22:00-06:00 crew counts again."),
        turn(4, "Defects by line", (without,)),
        turn(5, "Defects by week", (without,)),
    ]
    after = parse_sections(llm_free_fold(summary, lifted, 500))["instructions"]
    assert after == ["The 22:00-06:00 crew counts again", "Applied in SQL: i.day > 1"]
    # Without a take-back, queries that leave a condition out drop only the condition.
    quiet = [turn(3, "Defects by line", (without,)), turn(4, "Defects by week", (without,))]
    kept = parse_sections(llm_free_fold(summary, quiet, 500))["instructions"]
    assert kept == ["Going forward, the night shift is out", "Applied in SQL: i.day > 1"]


_WORDS = (
    "only the Nordics from now on exclude test accounts include again show amounts in EUR call "
    "it GMV not revenue we mean churned by - : ; , and so back to all regions plants count "
    "again is out wants ISO weeks define active as one with order in last 90 days ? . please "
    "can you what which"
)
_PIECES = st.sampled_from(_WORDS.split(" "))
_MESSAGES = st.lists(_PIECES, min_size=1, max_size=25).map(" ".join) | st.text(max_size=300)


@settings(max_examples=500, deadline=None)
@given(_MESSAGES)
def test_any_message_yields_one_line_instructions_whose_key_reads_back(query: str) -> None:
    for ins in detect(query):
        assert len(ins.text) <= 160 and "\n" not in ins.text
        assert key_of(ins.text) == ins.key  # the next fold files it under the same subject


@settings(max_examples=100, deadline=None)
@given(st.lists(_MESSAGES, min_size=1, max_size=12), st.integers(60, 500))
def test_folding_any_messages_stays_within_the_bound(queries: list[str], bound: int) -> None:
    summary: str | None = None
    for seq, query in enumerate(queries, start=1):
        summary = llm_free_fold(
            summary, [turn(seq, query, (f"SELECT 1 FROM t WHERE {query!r}",))], bound
        )
        assert count_tokens(summary) <= bound


def test_detect_answers_from_its_memo_are_fresh_lists() -> None:
    """detect() remembers recent messages (folds read each turn twice): a caller that changes
    the list it got must not change what the next caller gets."""
    from memory_core.instructions.detect import _detect

    query = "Exclude test accounts from now on; always use USD."
    first = detect(query)
    assert [i.key for i in first] == ["filter:test account", "currency"]
    first.clear()
    again = detect(query)
    assert [i.key for i in again] == ["filter:test account", "currency"]
    assert _detect.cache_info().maxsize == 1024  # bounded: a guest in its host
