"""The turns between instructions, and the SQL every turn runs under the instructions in force.

Filler turns are ordinary analytics work (questions by dimension and period, charts,
dashboards), small talk and trap questions that use an instruction's words without setting
one. The last `TAIL_TURNS` turns touch nothing an instruction governs (metadata queries, chart
cosmetics), so what the views keep of the instructions comes from the summary. A generator
seeded with the scenario's name picks among the phrasings: the output is fixed.
"""

from __future__ import annotations

import dataclasses
import random
import re
from string import Template
from typing import Any

from memory_core.cli.demo_script import Turn, chart, dashboard
from memory_core.eval.corpus import (
    TAIL_TURNS,
    Choice,
    Conversation,
    Dim,
    Domain,
    Metric,
    Say,
    Scenario,
    facts_of,
    state_at,
)
from memory_core.write.snapshot import DECLARED_MAX_CHARS

ROUNDING = {
    "-3": "ROUND({}, -3)",
    "-6": "ROUND({}, -6)",
    "0": "ROUND({})",
    "k1": "ROUND({} / 1000.0, 1)",
    "m2": "ROUND({} / 1e6, 2)",
}
GRAINS = ("month", "quarter", "week", "quarter")
PATTERN: tuple[str, ...] = ("query", "query", "chart", "query", "trap", "query", "smalltalk")
PATTERN += ("query", "dashboard", "query", "query", "trap")
QUESTIONS = (
    "What's {metric} by {dim} per {grain}?",
    "Break {metric} down by {dim}, {grain} by {grain}",
    "Can you show {metric} per {dim} for each {grain}?",
    "Which {dim} had the highest {metric} last {grain}?",
    "Top five {dims} by {metric}, per {grain}",
    "How did {metric} develop per {grain}? Split it by {dim}",
    "Give me {metric} by {dim} for the last four {grain}s",
    "Is {metric} growing for every {dim}? Show it by {grain}",
    "{metric} per {grain} and {dim}, please",
    "Where is {metric} weakest? By {dim}, per {grain}",
    "Quick one: {metric} for the latest {grain}, by {dim}",
    "hmm, can we look at {metric} by {dim} instead? per {grain}",
    "Pull {metric} per {dim} by {grain} for me",
)
# Questions that pick a value, a quarter and a top N of their own: per-question choices.
CHOICE_QUESTIONS = (
    "What about {value} in Q{q}? Top {k} {dims}",
    "And for {value} only, Q{q}: the top {k} {dims} by {metric}?",
    "Same for {value} in Q{q} - top {k} {dims}",
    "Now {value}, Q{q}. Which {k} {dims} lead on {metric}?",
    "Just {value} this time: top {k} {dims} in Q{q}",
    "{metric} for {value}, Q{q}, best {k} {dims}?",
)
# Follow-ups that keep the previous choice question's value, quarter and top N: a user asks
# about one product in one quarter for a few questions in a row, and it is still per question.
FOLLOW_UPS = (
    "And {metric} for the same {k}?",
    "Same again for {metric}",
    "ok and what does {metric} look like there?",
    "Still {value}, Q{q} - now {metric} please",
)
# The held-out rounds' choice questions and follow-ups: written apart, before the detector work
# on per-question choices, and never tuned against (conversations/README.md).
HELD_OUT_CHOICE_QUESTIONS = (
    "How about {value}? Q{q}, top {k} {dims}",
    "{value} in Q{q}: which {k} {dims} come out on top for {metric}?",
    "Q{q}, {value} only - {k} best {dims} please",
    "Let's see {value} for Q{q}, the {k} largest {dims} by {metric}",
    "Filter to {value} and Q{q} for this one, top {k} {dims}",
    "Show me the top {k} {dims} for {value} in Q{q}",
    "{metric}: {value}, Q{q}, top {k} {dims}",
)
HELD_OUT_FOLLOW_UPS = (
    "Same slice, but {metric}",
    "Keep {value} and Q{q}; swap in {metric}",
    "and {metric}?",
    "What's {metric} for those {k}?",
)
# How many follow-ups a choice question gets (drawn per question): at most MAX_FOLLOW_UPS.
FOLLOW_UP_COUNTS = (0, 0, 0, 1, 1, 2)
MAX_FOLLOW_UPS = max(FOLLOW_UP_COUNTS)
ANSWERS = (
    "{top} leads with {n1}; {second} follows at {n2}.",
    "{top} is highest at {n1}, {pct}% above {second}.",
    "{second} grew fastest (+{pct}%), but {top} is still the largest at {n1}.",
    "Here you go: {top} {n1}, {second} {n2}, everything else below {n3}.",
    "Fairly flat: {top} {n1} vs {second} {n2}, within {pct}% of each other.",
    "The latest {grain} shows {top} at {n1}, down {pct}% from the one before.",
)
CHARTS = (
    ("line", "Make that a line chart"),
    ("column", "Can I see that as a bar chart?"),
    ("area", "Plot it as an area chart"),
    ("pie", "Show the split as a pie"),
    ("scatter", "Scatter plot of that, please"),
    ("column", "Stack the bars by {dim}"),
)
PINS = (
    "Add it to the {dash} dashboard",
    "Pin that chart to {dash}",
    "Put this on {dash} too",
    "Can you drop that into the {dash} dashboard?",
)
SMALLTALK = (
    ("Thanks, that's useful", "Glad it helps."),
    ("ok give me a minute, checking something with finance", "Sure, I'll be here."),
    ("Nice. Let's keep going", "Ready when you are."),
    (
        "Hmm, that looks a bit off to me but let's continue",
        "Happy to double-check any number - just say which.",
    ),
    (
        "What's the difference between a median and a mean again?",
        "The median is the middle value; the mean is the average, so a few large values pull "
        "it up.",
    ),
    ("Morning! Picking this up again", "Good morning - the charts from yesterday are here."),
    ("Great, that matches what the sales team told me", "Good to have it confirmed."),
    ("I'll share these numbers in the weekly sync", "Sounds good."),
    ("Sorry, got pulled into a meeting", "No problem."),
    (
        "Is there a way to schedule this query to run every morning?",
        "Yes - Redash can refresh it on a schedule; I can set 07:00 daily.",
    ),
)


def period(state: dict[str, str], grain: str, ts: str) -> tuple[str, str]:
    """The period expression of a query at `grain`, following the calendar in force."""
    if grain == "week":
        week = state.get("week", "date_trunc('week', $ts)")
        return Template(week).substitute(ts=ts), "week"
    calendar = state.get("calendar", "calendar")
    if grain == "quarter" and calendar.startswith("fiscal:"):
        return f"fiscal_quarter({ts}, start_month => {calendar[7:]})", "fiscal_quarter"
    return f"date_trunc('{grain}', {ts})", grain


def _expand(template: str, values: dict[str, str]) -> str:
    text = template
    for _ in range(3):  # state values may refer to other state ($amount, $ts)
        text = Template(text).substitute(values)
    return text


def render_sql(
    domain: Domain, state: dict[str, str], where: list[str], *, metric: Metric, dim: Dim, grain: str
) -> str:
    ts = state["ts"]
    if "tz" in state:
        ts = f"({ts} AT TIME ZONE '{state['tz']}')"
    per, per_name = period(state, grain, ts)
    money = f"SUM({state['amount']})"
    if "round" in state:
        money = ROUNDING[state["round"]].format(money)
    values = {**state, "ts": ts, "money": money}
    column = dim.label.replace(" ", "_")
    lines = [
        f"SELECT {per} AS {per_name},",
        f"       {dim.column} AS {column},",
        f"       {_expand(metric.sql, values)} AS {_expand(metric.alias, values)}",
        f"FROM {domain.tables}",
        "WHERE " + "\n  AND ".join(where),
        "GROUP BY 1, 2",
        "ORDER BY 1, 2",
    ]
    return "\n".join(lines)


def _tail_pool(domain: Domain, rnd: random.Random) -> list[tuple[str, str, list[str]]]:
    table, dash = domain.table, domain.dashboards[0]
    info = (
        "SELECT column_name, data_type\nFROM information_schema.columns\n"
        f"WHERE table_name = '{table}'\nORDER BY ordinal_position"
    )
    load = f"SELECT MAX(loaded_at) AS last_load\nFROM etl.load_log\nWHERE table_name = '{table}'"
    return [
        (f"Which columns does the {table} table have?", f"{table} has 14 columns.", [info]),
        (
            f"How many rows are in {table} right now?",
            f"{rnd.randrange(2, 90)},{rnd.randrange(100, 999)},{rnd.randrange(100, 999)} rows.",
            [f"SELECT COUNT(*) AS row_count\nFROM {table}"],
        ),
        (f"When was {table} last refreshed?", "The last load finished at 06:12 today.", [load]),
        ("Make the chart colours match our brand palette", "Updated the series colours.", []),
        (f"Add a short description to the {dash} dashboard", "Added a two-line description.", []),
        ("Switch the last chart to a log scale", "The y axis now uses a log scale.", []),
        (f"Who else can see the {dash} dashboard?", "The analytics group (14 people).", []),
        ("Move the legend below the chart", "Legend moved.", []),
        ("Export the last table to CSV", "Exported - the link is in the results panel.", []),
        ("Rename the last chart to 'Draft'", "Renamed it to Draft.", []),
        ("Can you make the dashboard refresh every hour?", "Set to refresh hourly.", []),
    ]


def declarations(says: list[Say], all_says: tuple[Say, ...]) -> list[dict[str, str | None]]:
    """What an agent that declares would send for a message setting `says`: per instruction,
    its subject (`rule N`, N the place of the first instruction of the chain it replaces:
    a name that repeats none of the words the scoring looks for) and its own wording of it:
    the answer's, or the user's where only those name the content."""
    by_fact = {s.fact: s for s in all_says}
    roots = [s.fact for s in all_says if not s.replaces]
    out: list[dict[str, str | None]] = []
    for say in says:
        root = say
        while root.replaces and root.replaces in by_fact:
            root = by_fact[root.replaces]
        text = next(
            (t for t in (say.answer, say.query) if re.search(say.probe, t, re.I)),
            f"{say.query} ({say.answer})",
        )
        flat = " ".join(text.split())
        cut = flat if len(flat) <= DECLARED_MAX_CHARS else flat[: DECLARED_MAX_CHARS - 3] + "..."
        out.append({"subject": f"rule {roots.index(root.fact) + 1}", "text": cut})
    return out


class Script:
    """Builds one scenario's turns in order; every choice comes from one seeded generator.
    `declared`: every turn's agent declares the instructions it applies (an empty list on the
    turns that set none), as `TurnSnapshot.standing_instructions`."""

    def __init__(self, scenario: Scenario, declared: bool = False) -> None:
        self.declared = declared
        self.sc, self.d = scenario, scenario.domain
        self.rnd = random.Random(f"fidelity:{scenario.name}")  # noqa: S311 - a fixed corpus
        self.last: tuple[Metric, Dim, str] | None = None
        self.charts: list[int] = []
        self.pinned: dict[str, list[int]] = {name: [] for name in self.d.dashboards}
        self.traps = list(self.d.traps)
        self.step = self.rnd.randrange(len(PATTERN))
        self.chat = self.rnd.sample(SMALLTALK, len(SMALLTALK))
        self.next_is_choice = False
        self.follow: tuple[int, Choice, str, int, int] | None = None  # follow-ups left, picks
        self.chosen: dict[str, str] = {}  # per-question probe id -> probe

    def build(self) -> Conversation:
        says: dict[int, list[Say]] = {}
        for say in self.sc.says:
            says.setdefault(say.at, []).append(say)
        tail_from = self.sc.turns - TAIL_TURNS + 1
        pool = _tail_pool(self.d, self.rnd)
        tail = [*self.rnd.sample(pool, TAIL_TURNS - 1)]
        tail.append(("Thanks, that's all for today", "You're welcome - see you next time.", []))
        turns: list[Turn] = []
        for n in range(1, self.sc.turns + 1):
            if n in says:
                turn = self.instruction(says[n])
            elif n >= tail_from:
                query, answer, sql = tail[n - tail_from]
                turn = Turn(query, answer, sql)
            else:
                turn = self.filler(n)
            if self.declared:
                items = declarations(says[n], self.sc.says) if n in says else []
                turn = dataclasses.replace(turn, standing_instructions=items)
            turns.append(turn)
        facts = facts_of(self.sc.says)
        return Conversation(
            self.sc.name,
            tuple(turns),
            facts,
            holdout=self.sc.holdout,
            round=self.sc.round,
            per_question=tuple(sorted(self.chosen.items())),
        )

    def sql(self, turn: int, metric: Metric, dim: Dim, grain: str) -> str:
        state, where = state_at(self.d, self.sc.says, turn)
        return render_sql(self.d, state, where, metric=metric, dim=dim, grain=grain)

    def eligible(self, turn: int) -> list[Metric]:
        state, _ = state_at(self.d, self.sc.says, turn)
        return [m for m in self.d.metrics if m.needs() <= state.keys()]

    def instruction(self, says: list[Say]) -> Turn:
        """One message setting every Say of `says` (all at the same turn)."""
        at = says[0].at
        metric, dim, grain = self.last or (self.d.metrics[0], self.d.dims[0], "month")
        if uses := next((s.uses for s in says if s.uses), None):
            metric = next(m for m in self.eligible(at) if uses in m.needs())
        grain = next((s.grain for s in says if s.grain), grain)
        self.last = (metric, dim, grain)
        query, answer = " ".join(s.query for s in says), " ".join(s.answer for s in says)
        return Turn(query, answer, [self.sql(at, metric, dim, grain)])

    def filler(self, turn: int) -> Turn:
        kind = PATTERN[self.step % len(PATTERN)]
        self.step += 1
        if kind == "trap" and self.traps:
            return self.traps.pop(0)
        if kind == "smalltalk":
            self.chat.append(self.chat.pop(0))
            return Turn(*self.chat[-1])
        if kind == "chart" and self.last:
            return self.chart()
        if kind == "dashboard" and self.charts:
            return self.pin()
        if self.follow is None and self.d.choices:  # every other question picks its own
            self.next_is_choice = not self.next_is_choice
        if self.follow is not None or (self.d.choices and self.next_is_choice):
            return self.choice_question(turn)
        return self.question(turn)

    def choice_question(self, turn: int) -> Turn:
        """A question that picks a value of a choice, a quarter and a top N for itself, or a
        follow-up that keeps the last one's."""
        templates: tuple[str, ...]
        if self.follow is None:
            choice: Choice = self.rnd.choice(self.d.choices)
            value = self.rnd.choice(choice.values)
            q, k = self.rnd.randrange(1, 5), self.rnd.choice((3, 4, 5, 10))
            left = self.rnd.choice(FOLLOW_UP_COUNTS)
            templates = HELD_OUT_CHOICE_QUESTIONS if self.sc.holdout else CHOICE_QUESTIONS
        else:
            left, choice, value, q, k = self.follow
            left, templates = left - 1, HELD_OUT_FOLLOW_UPS if self.sc.holdout else FOLLOW_UPS
        self.follow = (left, choice, value, q, k) if left > 0 else None
        metric = self.rnd.choice(self.eligible(turn))
        dims = [d for d in self.d.dims if d.column != choice.column] or list(self.d.dims)
        dim = self.rnd.choice(dims)
        self.last = (metric, dim, "quarter")
        text = self.rnd.choice(templates).format(
            value=value, q=q, k=k, dims=dim.plural, metric=metric.label
        )
        state, where = state_at(self.d, self.sc.says, turn)
        quarter = f"date_trunc('quarter', {state['ts']}) = DATE '2024-{3 * q - 2:02d}-01'"
        picked = [*where, f"{choice.column} = '{value}'", quarter]
        sql = render_sql(self.d, state, picked, metric=metric, dim=dim, grain="quarter")
        sql = sql.replace(
            "GROUP BY 1, 2\nORDER BY 1, 2", f"GROUP BY 1, 2\nORDER BY 3 DESC\nLIMIT {k}"
        )
        self.chosen[f"choice:{choice.label}"] = rf"{re.escape(choice.column)}\s*(?:=|IN\b)"
        self.chosen["period:quarter"] = r"date_trunc\('quarter',[^)]*\)\s*="
        self.chosen["top-n"] = r"\bLIMIT\s+\d"
        top, second = self.rnd.sample(dim.values, 2)
        answer = f"In Q{q}, {top} leads for {value}; {second} is second."
        return Turn(text[:1].upper() + text[1:], answer, [sql])

    def question(self, turn: int) -> Turn:
        metric = self.rnd.choice(self.eligible(turn))
        dim = self.rnd.choice(self.d.dims)
        grain = GRAINS[turn % len(GRAINS)]
        self.last = (metric, dim, grain)
        text = self.rnd.choice(QUESTIONS).format(
            metric=metric.label, dim=dim.label, dims=dim.plural, grain=grain
        )
        top, second = self.rnd.sample(dim.values, 2)
        n1 = self.rnd.randrange(5_000, 90_000)
        numbers: dict[str, Any] = dict(n1=f"{n1:,}", n2=f"{n1 * 3 // 4:,}", n3=f"{n1 // 3:,}")
        answer = self.rnd.choice(ANSWERS).format(
            top=top, second=second, grain=grain, pct=self.rnd.randrange(2, 40), **numbers
        )
        return Turn(text[:1].upper() + text[1:], answer, [self.sql(turn, metric, dim, grain)])

    def chart(self) -> Turn:
        metric, dim, grain = self.last or (self.d.metrics[0], self.d.dims[0], "month")
        kind, text = self.rnd.choice(CHARTS)
        vid = 100 + len(self.charts) + 1
        self.charts.append(vid)
        name = f"{metric.label[:1].upper()}{metric.label[1:]} by {dim.label}"
        viz = chart(vid, name, kind, {grain: "x", "value": "y", dim.label: "series"})
        label = "bar" if kind == "column" else kind
        return Turn(text.format(dim=dim.label), f'Done: {label} chart "{name}".', [], [viz])

    def pin(self) -> Turn:
        name = self.rnd.choice(self.d.dashboards)
        widgets = self.pinned[name]
        widgets.append(self.charts[-1])
        did = 10 + self.d.dashboards.index(name)
        text = self.rnd.choice(PINS).format(dash=name)
        count = f"{len(widgets)} widget" + ("s" if len(widgets) > 1 else "")
        answer = f"{name} now has {count}."
        return Turn(text, answer, dashboards=[dashboard(did, name, *widgets)])
