"""render_conversation_context: focus rules, exact budgets, the summary always survives."""

from __future__ import annotations

import textwrap
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_core.copy.context import ConversationContext, Exchange
from memory_core.copy.views import (
    NEWEST_ALWAYS_FROM,
    TRUNCATED_MARKER,
    Focus,
    render_conversation_context,
    render_exchange,
)
from memory_core.tokens import count_tokens, encoding
from memory_core.write.artifacts import (
    Artifact,
    DashboardArtifact,
    SqlArtifact,
    VisualizationArtifact,
    indent_block,
)

SQL = (
    "SELECT region,\n       SUM(revenue) AS revenue\nFROM sales\nWHERE year = 2025\nGROUP BY region"
)
VIZ = VisualizationArtifact(
    id=17, type="CHART", name="Revenue by region", chart="column", x=("region",), y=("revenue",)
)
DASH = DashboardArtifact(id=3, name="Sales 2025", widget_count=2, visualization_ids=(17,))


def _ex(
    seq: int, query: str = "q", answer: str = "a", arts: list[Artifact] | None = None
) -> Exchange:
    return Exchange(
        seq=seq,
        session_id=uuid.UUID(int=seq),
        user_query=query,
        answer=answer,
        artifacts=tuple(arts) if arts is not None else (SqlArtifact(sql=SQL), VIZ, DASH),
        completed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def _ctx(
    n: int, summary: str | None = "Goal: revenue by region; returns excluded."
) -> ConversationContext:
    return ConversationContext(
        thread_id=uuid.UUID(int=1),
        summary=summary,
        summary_through_seq=0,
        recent=[_ex(i) for i in range(1, n + 1)],
    )


def test_sql_focus_keeps_sql_verbatim_and_one_lines_the_rest() -> None:
    out = render_conversation_context(_ctx(1), "sql", 1000)
    # Verbatim, every line indented two spaces (user text cannot pose as a view line).
    assert "SQL:\n" + textwrap.indent(SQL, "  ") in out
    assert 'Visualization #17 "Revenue by region" (chart/column)' in out
    assert "x: region" not in out


def test_visualizations_focus_expands_descriptors_and_one_lines_sql() -> None:
    out = render_conversation_context(_ctx(1), "visualizations", 1000)
    assert "  chart: column\n  x: region\n  y: revenue" in out
    assert "  visualizations: #17" in out
    assert SQL not in out and "SQL: SELECT region, SUM(revenue) AS revenue FROM sales" in out


def test_brief_focus_one_lines_everything_and_trims_the_gist() -> None:
    ctx = ConversationContext(
        thread_id=uuid.UUID(int=1), recent=[_ex(1, query="why " * 200, answer="because " * 200)]
    )
    out = render_conversation_context(ctx, "brief", 2000)
    assert SQL not in out and "x: region" not in out
    assert len(out) < 900


def test_oldest_exchanges_are_dropped_first() -> None:
    ctx = _ctx(30)
    out = render_conversation_context(ctx, "sql", 600)
    kept = [e.seq for e in ctx.recent if f"[#{e.seq}] User:" in out]
    assert kept and kept == list(range(31 - len(kept), 31))
    assert f"({30 - len(kept)} older exchanges omitted)" in out
    assert out.startswith("Conversation summary:\n  Goal: revenue by region")


def test_summary_alone_over_budget_is_cut_with_marker() -> None:
    ctx = _ctx(3, summary="word " * 2000)
    out = render_conversation_context(ctx, "brief", 100)
    assert out.startswith("Conversation summary:\n  word") and TRUNCATED_MARKER in out
    # The summary keeps half the budget; the newest exchange still has its place.
    assert count_tokens(out) <= 100 and "[#3] User: q" in out and "[#2]" not in out
    assert "(2 older exchanges omitted)" in out


def _big_sql(tokens: int) -> str:
    lines: list[str] = []
    n = 0
    while n < tokens:
        line = f"  OR customer_id = {1000 + len(lines)} AND region = 'EMEA-{len(lines)}'"
        lines.append(line)
        n += count_tokens(line + "\n")
    return "SELECT *\nFROM orders\nWHERE false\n" + "\n".join(lines)


def test_the_newest_exchange_is_in_the_view_with_its_sql_cut_when_it_alone_is_over() -> None:
    """4 turns, the newest SQL ~5 700 tokens, a 1 500-token sql view: the view was empty."""
    sql = _big_sql(5720)
    recent = [_ex(i, query=f"question {i}", arts=[SqlArtifact(sql=SQL)]) for i in (1, 2, 3)]
    recent.append(_ex(4, query="all EMEA orders", arts=[SqlArtifact(sql=sql), VIZ]))
    ctx = ConversationContext(thread_id=uuid.UUID(int=1), summary=None, recent=recent)
    out = render_conversation_context(ctx, "sql", 1500)
    assert count_tokens(out) <= 1500
    assert "[#4] User: all EMEA orders" in out
    assert "SQL:\n  SELECT *\n  FROM orders\n  WHERE false\n" in out
    assert "\n[...SQL truncated]\n" in out and sql not in out
    assert 'Visualization #17 "Revenue by region"' in out  # what follows the SQL stays
    assert "(3 older exchanges omitted)" in out
    assert count_tokens(out) > 1200  # the SQL is cut to the budget, not dropped


def test_a_view_says_how_many_exchanges_it_left_out_even_when_none_fit() -> None:
    ctx = ConversationContext(
        thread_id=uuid.UUID(int=1), recent=[_ex(i, query="why " * 300) for i in (1, 2, 3)]
    )
    for budget in range(0, 40):
        out = render_conversation_context(ctx, "brief", budget)
        assert count_tokens(out) <= budget
        shown = [i for i in (1, 2, 3) if f"[#{i}] User:" in out]
        left_out = 3 - len(shown)
        if left_out and out:
            older = "older " if shown else ""
            assert f"({left_out} {older}exchanges omitted)" in out, (budget, out)
    assert "[#3] User: why why" in render_conversation_context(ctx, "brief", 30)


def test_bad_focus_and_budget_are_rejected() -> None:
    with pytest.raises(ValueError, match="focus must be one of"):
        # "charts" is no Focus: the call is wrong on purpose.
        render_conversation_context(_ctx(1), "charts", 100)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        render_conversation_context(_ctx(1), "sql", -1)


text = st.text(st.characters(exclude_categories=["Cs"]), max_size=400)
artifact = st.one_of(
    st.builds(SqlArtifact, sql=text.filter(str.strip)),
    st.builds(
        VisualizationArtifact,
        id=st.integers(0, 10**6),
        type=st.sampled_from(["CHART", "TABLE"]),
        name=text,
        chart=st.none() | st.sampled_from(["column", "line", "pie"]),
        x=st.lists(text, max_size=3),
        y=st.lists(text, max_size=3),
    ),
    st.builds(
        DashboardArtifact,
        id=st.integers(0, 10**6),
        name=text,
        widget_count=st.integers(0, 50),
        visualization_ids=st.lists(st.integers(0, 99), max_size=5),
    ),
)


@st.composite
def contexts(draw: st.DrawFn) -> ConversationContext:
    n = draw(st.integers(0, 25))
    recent = [
        Exchange(
            seq=i + 1,
            session_id=uuid.UUID(int=i + 1),
            user_query=draw(text),
            answer=draw(text),
            artifacts=tuple(draw(st.lists(artifact, max_size=4))),
            completed_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        for i in range(n)
    ]
    summary = draw(st.none() | st.text(st.characters(exclude_categories=["Cs"]), max_size=3000))
    return ConversationContext(thread_id=uuid.UUID(int=7), summary=summary, recent=recent)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ctx=contexts(),
    focus=st.sampled_from(["brief", "sql", "visualizations"]),
    budget=st.integers(0, 3000),
)
def test_view_never_exceeds_budget_and_keeps_summary(
    ctx: ConversationContext, focus: Focus, budget: int
) -> None:
    out = render_conversation_context(ctx, focus, budget)
    # Exact count of the whole output, independent of the per-part accounting.
    assert len(encoding().encode_ordinary(out)) <= budget
    assert out == render_conversation_context(ctx, focus, budget)
    if ctx.summary and ctx.summary.strip() and budget >= 40:
        assert out.startswith("Conversation summary:\n")
        full = indent_block(ctx.summary.strip("\n").rstrip()) in out
        assert full or TRUNCATED_MARKER in out
    if ctx.recent:
        # Room for the newest exchange whenever it fits in half the budget.
        newest = render_exchange(ctx.recent[-1], focus)
        if count_tokens("Recent exchanges (oldest first):\n" + newest) <= budget // 2:
            assert f"[#{ctx.recent[-1].seq}] User: " in out
    kept = [e.seq for e in ctx.recent if f"[#{e.seq}] User: " in out]
    assert kept == [e.seq for e in ctx.recent][len(ctx.recent) - len(kept) :]
    if ctx.recent and budget >= NEWEST_ALWAYS_FROM:
        # The newest exchange is always in the view, and the view counts what it left out.
        assert f"[#{ctx.recent[-1].seq}] User: " in out
        if len(kept) < len(ctx.recent):
            assert f"({len(ctx.recent) - len(kept)} older exchanges omitted)" in out
