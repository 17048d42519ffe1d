"""The deterministic planner: reads the node views (plain text) and decides, without an LLM.

Each function gets only what its node would put in a prompt: the user's question and that
node's view of conversation memory (`brief` for intent, `sql` for the SQL writer,
`visualizations` for the visualizer). That keeps the example honest: whatever the planner
resolves ("that", "break it down", "make that a bar chart") it resolves from memory as
rendered, the same text an LLM would be shown. `llm_sql` is the optional LLM variant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Dimensions the agent can break a query down by: name -> SELECT expression.
DIMENSIONS = {
    "region": "region",
    "product": "product",
    "month": "to_char(order_date, 'YYYY-MM') AS month",
}
CHART_KINDS = {"bar": "column", "column": "column", "line": "line", "pie": "pie", "area": "area"}
_REFERS_BACK = re.compile(r"\b(that|this|it|those|these|same|now|break|split)\b", re.IGNORECASE)


@dataclass(frozen=True)
class PriorSql:
    seq: int
    sql: str


def earlier_turns(view: str) -> list[int]:
    """Seq numbers of the exchanges a view shows ('[#3] User: ...')."""
    return [int(n) for n in re.findall(r"^\[#(\d+)\] User:", view, re.MULTILINE)]


def plan_intent(question: str, brief_view: str) -> dict[str, Any]:
    """new_query | refine (add a breakdown to the last query) | visualize (chart the last one)."""
    q = question.lower()
    prior = earlier_turns(brief_view)
    chart = next((kind for word, kind in CHART_KINDS.items() if word in q), None)
    wants_chart = chart is not None or any(w in q for w in ("chart", "plot", "graph", "visual"))
    dimension = next((d for d in DIMENSIONS if re.search(rf"\bby {d}\b", q)), None)
    if prior and wants_chart:
        return {"kind": "visualize", "chart": chart or "column", "about_turn": prior[-1]}
    if prior and dimension and _REFERS_BACK.search(q):
        return {"kind": "refine", "dimension": dimension, "about_turn": prior[-1]}
    return {"kind": "new_query", "dimension": dimension}


# -- standing instructions: what the user sets for the rest of the thread --------------------

_LASTING = re.compile(r"\b(?:from now on|going forward|always|by default|for the rest)\b", re.I)
_NO_RETURNS = re.compile(r"\b(?:leave out|exclude|excluding|without|drop|ignore)\s+returns\b", re.I)
_RETURNS_BACK = re.compile(
    r"\b(?:include|count|bring back)\s+returns\s+again\b|\bstop excluding returns\b", re.I
)
_ONLY_REGION = re.compile(r"\bonly (?:the )?(north|south|east|west) region\b", re.I)
_ALL_REGIONS = re.compile(r"\ball regions again\b", re.I)
_DECLARED = re.compile(r"^\s*- Declared \((?P<subject>[^()]+)\): (?P<text>.*)$", re.MULTILINE)
_APPLIED = re.compile(r"\(SQL: (?P<sql>.+)\)$")


def declare(question: str) -> list[dict[str, str | None]]:
    """What the user sets for the rest of the thread in this question, as the agent declares
    it to memory (`standing_instructions`): subject, and a text whose `(SQL: ...)` is the
    condition the planner applies; None withdraws the subject. [] when nothing changes."""
    out: list[dict[str, str | None]] = []
    if _RETURNS_BACK.search(question):
        out.append({"subject": "returns", "text": None})
    elif _LASTING.search(question) and _NO_RETURNS.search(question):
        out.append({"subject": "returns", "text": "Leave out returns (SQL: NOT is_return)"})
    if _ALL_REGIONS.search(question):
        out.append({"subject": "region", "text": None})
    elif _LASTING.search(question) and (m := _ONLY_REGION.search(question)):
        region = m.group(1).capitalize()
        out.append(
            {"subject": "region", "text": f"Only the {region} region (SQL: region = '{region}')"}
        )
    return out


def standing_conditions(view: str, declared: list[dict[str, str | None]]) -> list[str]:
    """The WHERE conditions of the standing instructions in force: those the view's summary
    section declares (memory applies newer declarations over older ones), with this run's
    own declarations over them."""
    texts = {m["subject"]: m["text"] for m in _DECLARED.finditer(view)}
    texts.update({d["subject"]: d["text"] for d in declared if d["subject"]})
    found = [_APPLIED.search(t) for t in texts.values() if t]
    return [m["sql"] for m in found if m]


def new_sql(question: str, dimension: str | None = None, standing: list[str] | None = None) -> str:
    """SQL for a fresh question: metric, year, returns filter, the standing conditions in
    force, optional breakdown."""
    q = question.lower()
    if re.search(r"\b(how many|number of|count of) orders\b", q):
        select = "COUNT(*) AS orders"
    elif re.search(r"\b(units|quantity)\b", q):
        select = "SUM(quantity) AS units"
    else:
        select = "SUM(revenue) AS revenue"
    where = []
    year = re.search(r"\b(20\d\d)\b", q)
    if year:
        y = int(year.group(1))
        where.append(f"order_date >= DATE '{y}-01-01' AND order_date < DATE '{y + 1}-01-01'")
    if re.search(r"\b(excluding|excl\.?|without|net of|minus)\s+returns?\b", q):
        where.append("NOT is_return")
    where += [c for c in standing or [] if c not in where]
    lines = [f"SELECT {select}", "FROM sales"]
    if where:
        lines.append("WHERE " + "\n  AND ".join(where))
    sql = "\n".join(lines)
    return extend_sql(sql, dimension) if dimension else sql


def last_sql(sql_view: str) -> PriorSql | None:
    """The newest verbatim SQL block in an `sql` view, with the turn it belongs to."""
    found: PriorSql | None = None
    seq = 0
    block: list[str] | None = None
    for line in [*sql_view.splitlines(), ""]:
        turn = re.match(r"^\[#(\d+)\] User:", line)
        if block is not None and (not line.startswith("  ") or turn or _artifact_line(line)):
            found, block = PriorSql(seq, "\n".join(block).strip()), None
        if turn:
            seq = int(turn.group(1))
        elif line == "SQL:":
            block = []
        elif block is not None:
            block.append(line.removeprefix("  "))  # views indent verbatim SQL by two spaces
    return found


def _artifact_line(line: str) -> bool:
    return line.startswith(("SQL:", "Visualization #", "Dashboard #", "Assistant:"))


def extend_sql(sql: str, dimension: str) -> str:
    """The same query (same filters) broken down by `dimension`."""
    expr = DIMENSIONS[dimension]
    body = re.sub(r"(?is)\s+ORDER\s+BY\s+.*$", "", sql.strip().rstrip(";"))
    if re.search(rf"(?is)\bGROUP\s+BY\b.*\b{dimension}\b", body):
        return sql  # already broken down by it
    metric = re.search(r"(?i)\b(?:SUM|COUNT|AVG|MIN|MAX)\s*\(.*?\)\s+AS\s+(\w+)", body)
    body = re.sub(r"(?is)^(\s*SELECT\s+)", lambda m: f"{m.group(1)}{expr}, ", body, count=1)
    if re.search(r"(?i)\bGROUP\s+BY\b", body):
        body = re.sub(r"(?i)(\bGROUP\s+BY\s+)", lambda m: f"{m.group(1)}{dimension}, ", body)
    else:
        body += f"\nGROUP BY {dimension}"
    order = f"{metric.group(1)} DESC" if metric else dimension
    return f"{body}\nORDER BY {order}"


def describe_sql(sql: str) -> str:
    """A short title for what a query computes ('Revenue by region, 2025, excl. returns')."""
    metric = re.search(r"(?i)\bAS\s+(revenue|units|orders)\b", sql)
    title = (metric.group(1) if metric else "result").capitalize()
    group = re.search(r"(?is)\bGROUP\s+BY\s+(.*?)(?:\bORDER\b|\bLIMIT\b|$)", sql)
    if group:
        title += " by " + " and ".join(c.strip() for c in group.group(1).split(","))
    year = re.search(r"DATE '(\d{4})-01-01'", sql)
    if year:
        title += f", {year.group(1)}"
    if re.search(r"(?i)\bNOT\s+is_return\b", sql):
        title += ", excl. returns"
    return title


def last_visualization(viz_view: str) -> dict[str, Any] | None:
    """The newest visualization an expanded `visualizations` view describes."""
    found = None
    for m in re.finditer(r'^Visualization #(\S+) "(.*)"\n  type: (\w+)', viz_view, re.MULTILINE):
        found = {"id": m.group(1), "name": m.group(2), "type": m.group(3)}
    return found


def next_visualization_id(viz_view: str) -> int:
    ids = [int(n) for n in re.findall(r"Visualization #(\d+)", viz_view)]
    return max(ids, default=0) + 1


def choose_visualization(
    plan: dict[str, Any], result: dict[str, Any], viz_view: str, title: str
) -> dict[str, Any]:
    """A Redash-style visualization for the result: what the user asked for, else a default."""
    columns, rows = result["columns"], result["rows"]
    numeric = [c for i, c in enumerate(columns) if rows and isinstance(rows[0][i], int | float)]
    labels = [c for c in columns if c not in numeric]
    viz: dict[str, Any] = {"id": next_visualization_id(viz_view), "name": title}
    if plan["kind"] == "visualize" and labels and numeric:
        previous = last_visualization(viz_view)
        viz["name"] = previous["name"] if previous else title
        mapping = {labels[0]: "x", **{c: "y" for c in numeric}}
        viz["type"] = "CHART"
        viz["options"] = {
            "globalSeriesType": plan["chart"],
            "columnMapping": mapping,
            "xAxis": {"type": "category", "labels": {"enabled": True}},
            "legend": {"enabled": len(numeric) > 1},
        }
    elif len(rows) == 1 and len(columns) == 1 and numeric:
        viz["type"] = "COUNTER"
        viz["options"] = {"counterColName": numeric[0], "stringDecimal": 2}
    else:
        viz["type"] = "TABLE"
        viz["options"] = {"itemsPerPage": 25}
    return viz


def compose_answer(title: str, result: dict[str, Any], viz: dict[str, Any] | None) -> str:
    columns, rows = result["columns"], result["rows"]
    if len(rows) == 1 and len(columns) == 1:
        text = f"{title}: {_fmt(rows[0][0])}."
    else:
        shown = "; ".join(" ".join(_fmt(v) for v in row) for row in rows[:6])
        text = f"{title}: {shown}" + (" ..." if len(rows) > 6 else ".")
    if viz and viz["type"] == "CHART":
        text += f' Built visualization #{viz["id"]} "{viz["name"]}" as a {_chart_word(viz)}.'
    return text


def _chart_word(viz: dict[str, Any]) -> str:
    kind = viz["options"]["globalSeriesType"]
    return "bar chart (column)" if kind == "column" else f"{kind} chart"


def _fmt(value: Any) -> str:
    return f"{value:,.2f}" if isinstance(value, float) else str(value)


# -- optional: an OpenAI-compatible LLM writes the SQL from the same view --------------------

SQL_SYSTEM_PROMPT = (
    "You write one read-only PostgreSQL SELECT for an analytics agent. Table: {table}. "
    "Follow-up questions refer to the conversation below: keep the filters of the query they "
    "refer to. Answer with the SQL only, no explanation, no code fences."
)


def llm_sql(question: str, sql_view: str, table_doc: str, settings: Any) -> str | None:
    """Ask the configured LLM for the SQL; None when it fails or answers with anything else."""
    from openai import OpenAI

    client = OpenAI(
        base_url=settings.openai_base_url,
        api_key=settings.openai_api_key or "unset",
        timeout=settings.memory_llm_timeout_s,
        max_retries=0,
    )
    try:
        reply = client.chat.completions.create(
            model=settings.memory_summarizer_model,
            temperature=0,
            messages=[
                {"role": "system", "content": SQL_SYSTEM_PROMPT.format(table=table_doc)},
                {"role": "user", "content": f"{sql_view}\nQuestion: {question}"},
            ],
        )
        text = (reply.choices[0].message.content or "").strip()
    except Exception:
        return None
    text = re.sub(r"^```(?:sql)?\s*|\s*```$", "", text).strip().rstrip(";")
    if not re.match(r"(?is)^(SELECT|WITH)\b", text) or ";" in text:
        return None
    return text
