"""What stands from SQL: per-question picks never do, rules held in a row do, the user sets the
rest; and the conventions that live in a SELECT (issue 34)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_core.copy.context import Exchange
from memory_core.fold.llm_free import llm_free_fold, parse_sections
from memory_core.instructions.detect import key_of, states
from memory_core.instructions.sql_conditions import sql_conditions
from memory_core.instructions.sql_select import select_features
from memory_core.instructions.standing import SQL_STANDING_QUERIES, parse_seen
from memory_core.write.artifacts import derive_artifacts

BASE = "s.sold_at >= DATE '2024-01-01' AND NOT s.is_test"


def turn(seq: int, query: str, *sql: str) -> Exchange:
    return Exchange(
        seq=seq,
        session_id=uuid.UUID(int=seq),
        user_query=query,
        answer="Done.",
        artifacts=derive_artifacts(sql, (), ()),
        completed_at=datetime(2026, 12, 1, tzinfo=UTC),
    )


def query(where: str = "", limit: int | None = None, select: str = "SUM(s.amount) AS sales") -> str:
    sql = (
        f"SELECT r.region AS region, {select}\nFROM sales s JOIN regions r ON r.id = s.rid\n"
        f"WHERE {BASE}{' AND ' + where if where else ''}\nGROUP BY 1\nORDER BY 2 DESC"
    )
    return sql + (f"\nLIMIT {limit}" if limit else "")


def standing(summary: str) -> list[str]:
    return parse_sections(summary)["instructions"]


def fold_all(turns: list[Exchange], per_fold: int = 11) -> str:
    summary: str | None = None
    for i in range(0, len(turns), per_fold):
        summary = llm_free_fold(summary, turns[i : i + per_fold], 500)
    return summary or ""


# A pick of a product, a quarter and a top N, as questions make them.
_PICK = st.tuples(
    st.sampled_from(["Laptops", "Phones", "Tablets", "TVs"]),
    st.integers(1, 4),
    st.sampled_from([3, 4, 5, 10]),
    st.integers(0, SQL_STANDING_QUERIES - 2),  # follow-ups that keep it
)
_QUESTIONS = (
    "What about {p} in Q{q}? Top {k} regions",
    "Just {p} this time: top {k} regions in Q{q}",
    "{p}, Q{q}. Which {k} regions lead?",
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_PICK, min_size=2, max_size=14), st.integers(3, 12), st.randoms())
def test_per_question_values_never_stand(picks: list, per_fold: int, rnd) -> None:  # type: ignore[no-untyped-def]
    """The issue's thread: every question picks its own product, quarter and top N (some kept
    for a follow-up or two), between ordinary questions; no fold shows any as standing."""
    turns: list[Exchange] = []
    for product, q, k, follow in picks:
        quarter = f"date_trunc('quarter', s.sold_at) = DATE '2024-{3 * q - 2:02d}-01'"
        where = f"s.product = '{product}' AND {quarter}"
        text = rnd.choice(_QUESTIONS).format(p=product, q=q, k=k)
        turns.append(turn(len(turns) + 1, text, query(where, k)))
        for _ in range(follow):
            turns.append(turn(len(turns) + 1, "And the margin for those?", query(where, k)))
        turns.append(turn(len(turns) + 1, "Sales by region per month?", query()))
    section = "\n".join(standing(fold_all(turns, per_fold)))
    assert "s.product" not in section and "date_trunc" not in section and "LIMIT" not in section


def test_a_condition_held_in_a_row_stands_across_folds_and_a_changed_value_starts_again() -> None:
    rule = "s.channel <> 'b2b'"
    turns = [turn(n, "Sales by region?", query(rule)) for n in range(1, SQL_STANDING_QUERIES)]
    summary = llm_free_fold(None, turns[:2], 500)  # the count is kept in the summary
    seen = parse_sections(summary)["seen"]
    assert parse_seen(next(s for s in seen if "b2b" in s)) == (f"Applied in SQL: {rule}", 2)
    summary = llm_free_fold(summary, turns[2:], 500)
    assert f"Applied in SQL: {rule}" not in standing(summary)
    summary = llm_free_fold(summary, [turn(9, "Again?", query(rule))], 500)
    assert f"Applied in SQL: {rule}" in standing(summary)
    # Another value: a pick that starts again; left out by a query on its table: gone.
    other = [turn(10 + n, "Sales?", query("s.channel <> 'retail'")) for n in range(3)]
    changed = llm_free_fold(None, turns[:2] + other, 500)
    assert not any("channel" in line for line in standing(changed))
    dropped = llm_free_fold(None, [*turns[:2], turn(20, "Sales?", query())], 500)
    assert not any("channel" in s for s in parse_sections(dropped)["seen"])


@pytest.mark.parametrize(
    "period",
    [
        "date_trunc('quarter', s.sold_at) = DATE '2024-07-01'",
        "s.sold_at BETWEEN DATE '2024-01-01' AND DATE '2024-03-31'",
        "s.sold_at >= '2024-04-01' AND s.sold_at < '2024-07-01'",
        "EXTRACT(YEAR FROM s.sold_at) = 2011",
        "s.year = 2011",
    ],
)
def test_a_single_period_never_stands_from_sql_even_when_every_query_repeats_it(
    period: str,
) -> None:
    turns = [turn(n, "Sales by region?", query(period)) for n in range(1, 12)]
    conditions = sql_conditions(query(period))
    picked = [c for c in conditions if c.text.removeprefix("Applied in SQL: ") in period]
    assert picked and all(c.period for c in picked)
    section = "\n".join(standing(llm_free_fold(None, turns, 500)))
    assert "2011" not in section and "07-01" not in section and "04-01" not in section
    assert "Applied in SQL: s.sold_at >= DATE '2024-01-01'" in section  # an open start stands


def test_what_the_user_set_stands_at_once_and_a_one_off_pick_does_not() -> None:
    said = turn(1, "Leave out refunds from now on.", query("s.status <> 'refunded'"))
    assert "Applied in SQL: s.status <> 'refunded'" in standing(llm_free_fold(None, [said], 500))
    once = turn(1, "Just Laptops this time, top 5.", query("s.product = 'Laptops'", 5))
    assert not any("Laptops" in line for line in standing(llm_free_fold(None, [once], 500)))
    # A statement the detector has no words for still sets a restriction it brings in...
    assert states("Returns are never part of net sales.")
    quiet = turn(1, "Returns are never part of net sales.", query("NOT s.is_return"))
    assert "Applied in SQL: NOT s.is_return" in standing(llm_free_fold(None, [quiet], 500))
    # ...but not a value it picks: that may be one question's.
    pick = turn(1, "Laptops are what matters here.", query("s.product = 'Laptops'"))
    assert not any("Laptops" in line for line in standing(llm_free_fold(None, [pick], 500)))


def test_queries_on_another_table_do_not_break_a_run() -> None:
    rule = "s.channel <> 'b2b'"
    other = "SELECT COUNT(*) FROM users u WHERE u.active"
    turns = []
    for n in range(SQL_STANDING_QUERIES):
        turns += [turn(2 * n + 1, "Sales?", query(rule)), turn(2 * n + 2, "Users?", other)]
    assert f"Applied in SQL: {rule}" in standing(llm_free_fold(None, turns, 500))


TZ = "SELECT date_trunc('month', (s.sold_at AT TIME ZONE 'Europe/Berlin')) AS month, "


def test_a_stated_time_zone_and_definition_reach_the_section_a_questions_formula_does_not() -> None:
    ratio = "ROUND(100.0 * SUM(s.margin) / NULLIF(SUM(s.amount), 0), 1) AS margin_pct"
    plain = f"SELECT r.region, {ratio} FROM sales s JOIN regions r ON r.id = s.rid WHERE s.x"
    asked = llm_free_fold(None, [turn(1, "What's the margin % by region?", plain)], 500)
    assert not any("margin_pct" in line for line in standing(asked))
    told = [
        turn(1, "Show dates in Berlin time.", TZ + "SUM(s.amount) AS sales FROM sales s"),
        turn(2, "Margin % is margin over sales, one decimal.", plain),
    ]
    section = standing(llm_free_fold(None, told, 500))
    assert "Applied in SQL: s.sold_at AT TIME ZONE 'Europe/Berlin'" in section
    assert f"Applied in SQL: {ratio}" in section
    assert key_of(f"Applied in SQL: {ratio}") == "sql:select:margin_pct"


def test_a_stated_change_of_column_retires_the_conventions_built_on_the_old_one() -> None:
    gbp = "ROUND(AVG(o.amount_gbp), 2) AS avg_order"
    usd_sum = "ROUND(SUM(o.amount_usd), -3) AS revenue"
    gbp_sum = "ROUND(SUM(o.amount_gbp), -3) AS revenue"
    sql = "SELECT {} FROM orders o WHERE NOT o.is_test"
    turns = [
        turn(1, "Report everything in pounds, rounded to thousands.", sql.format(gbp_sum)),
        turn(2, "Average order value should be in pounds too.", sql.format(gbp)),
        turn(3, "Everything is in US dollars now.", sql.format(usd_sum)),
    ]
    section = "\n".join(standing(llm_free_fold(None, turns, 500)))
    assert "amount_usd" in section and "amount_gbp" not in section


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=300))
def test_any_query_text_gives_one_line_conditions_whose_key_reads_back(sql: str) -> None:
    for text in (f"SELECT a FROM t WHERE {sql}", f"SELECT {sql} AS x FROM t", sql):
        found = [(c.key, c.text) for c in sql_conditions(text)] + list(select_features(text))
        for key, line in found:
            assert "\n" not in line and len(line) <= 160
            assert key_of(line) == key or line.endswith("...")


def test_a_replacement_named_anew_goes_by_what_its_query_changed() -> None:
    """The new wording shares no subject with the old ("lost" for the churn rate); the SQL
    shows what it replaced: the instruction that named the formula it changed."""
    old = "ROUND(100.0 * AVG((a.cancelled_at IS NOT NULL)::int), 1) AS churn_rate_pct"
    new = (
        "ROUND(100.0 * AVG((a.last_login < now() - interval '90 days')::int), 1) AS churn_rate_pct"
    )
    sql = "SELECT a.plan AS plan, {} FROM accounts a WHERE NOT a.is_test"
    first = [
        turn(
            1, "Churn rate is cancelled accounts over all accounts, as a percent.", sql.format(old)
        ),
        turn(2, "Leave out test accounts from now on.", sql.format(old)),
    ]
    summary = llm_free_fold(None, first, 500)
    assert any(line.startswith("Churn rate is") for line in standing(summary))
    later = [
        turn(3, "An account is lost once it has gone 90 days without a login.", sql.format(new))
    ]
    section = standing(llm_free_fold(summary, later, 500))
    assert not any(line.startswith("Churn rate is") for line in section)
    assert f"Applied in SQL: {new}" in section
    assert "Leave out test accounts from now on" in section  # one shared word is not enough


def test_a_statement_of_50_000_characters_is_read_only_as_far_as_a_convention_can_be() -> None:
    """A fold reads every query's SELECT list; one that runs past MAX_SCAN characters before
    its FROM names no convention (a line would show 160 of them), whatever it holds."""
    from memory_core.instructions.sql_select import MAX_SCAN

    pad = "'" + "x" * 50_000 + "'"
    long = f"SELECT ROUND(SUM(s.a) / 1e3, 1) AS k, {pad} AS pad FROM sales s WHERE NOT s.t"
    short = "SELECT ROUND(SUM(s.a) / 1e3, 1) AS k FROM sales s WHERE NOT s.t"
    assert len(long) > 10 * MAX_SCAN
    assert select_features(long) == ()
    assert [k for k, _ in select_features(short)] == ["sql:select:k"]
    assert [c.text for c in sql_conditions(long)] == ["Applied in SQL: NOT s.t"]
