"""WHERE conditions of the queries a thread ran: the instructions its artifacts applied.

Each top-level conjunct of a WHERE clause is one condition, keyed by the columns it tests and
the kind of comparison (`sql:country`, `sql:is_test:not`, `sql:ordered_at:lower`): a newer
condition under the same key replaces the older, while a lower and an upper bound, or a filter
and an exclusion on one column, stand side by side. A user instruction that speaks about a
condition's columns or values revokes it ("include test accounts again" drops `NOT a.is_test`
and `email NOT LIKE '%@test.com'`; a new region scope drops `country IN (...)`).

A condition that picks one period (`date_trunc('quarter', ts) = DATE '2024-07-01'`, a year, a
`BETWEEN` of dates, or a lower and an upper date bound in one query) is what a question asks
about, not a rule: `Condition.period` says so, and standing.py never promotes one from SQL alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import NamedTuple

from memory_core.instructions.sql_select import select_key, selects
from memory_core.write.artifacts import one_line

SQL_PREFIX = "Applied in SQL: "
MAX_CHARS = 160

_SQL_STOP = re.compile(
    r"\b(?:group\s+by|order\s+by|having|limit|union|window|qualify|offset|fetch)\b", re.I
)
_STRING = re.compile(r"'(?:[^']|'')*'")


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_SQL_NOISE = _set(
    "and or not is null in like ilike between true false select from where exists interval "
    "now current_date date_trunc cast as case when then else end lower upper coalesce date "
    "timestamp timestamptz time zone at extract date_part to_char current_timestamp"
)
# Columns a scope of each kind is about.
SCOPE_COLUMNS = {
    "region": _set("region country countries market territory geo continent state city area"),
    "segment": _set("plan tier segment size edition package"),
    "channel": _set("channel source medium store"),
}


def _where_clauses(sql: str) -> Iterable[str]:
    flat = " ".join(sql.split())
    for m in re.finditer(r"\bwhere\b", flat, re.I):
        i, depth = m.end(), 0
        while i < len(flat):
            c = flat[i]
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and (c == ";" or _SQL_STOP.match(flat, i)):
                break
            i += 1
        if clause := flat[m.end() : i].strip():
            yield clause


def _split_and(clause: str) -> list[str]:
    """Top-level AND conjuncts (BETWEEN x AND y stays whole)."""
    parts, depth, start, between = [], 0, 0, False
    for m in re.finditer(r"\(|\)|'(?:[^']|'')*'|\bbetween\b|\band\b", clause, re.I):
        tok = m.group(0).lower()
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
        elif tok == "between":
            between = True
        elif tok == "and" and depth == 0:
            if between:
                between = False
                continue
            parts.append(clause[start : m.start()].strip())
            start = m.end()
    parts.append(clause[start:].strip())
    return [p for p in parts if p]


def _names(condition: str) -> list[str]:
    names = re.findall(r"[A-Za-z_][\w.]*", _STRING.sub(" ", condition))
    return [n for n in names if n.lower() not in _SQL_NOISE]


def columns(condition: str) -> list[str]:
    return sorted({n.split(".")[-1].lower() for n in _names(condition)})


def qualifiers(condition: str) -> set[str]:
    """Table aliases a condition names (`c` of `c.country`)."""
    return {n.split(".")[0].lower() for n in _names(condition) if "." in n}


# The kind of comparison a condition makes (its first operator outside string literals).
_OPERATOR = re.compile(
    r"<>|!=|>=?|<=?|=|\bnot\s+(?:in|i?like|between)\b|\bis\s+not\b|\bin\b|\bi?like\b|\bbetween\b"
    r"|\bis\b|^\s*not\b",
    re.I,
)
_KINDS = {">": "lower", ">=": "lower", "<": "upper", "<=": "upper", "between": "range"}


def comparison(condition: str) -> str:
    """ "" (equality, membership, a bare flag), "not", "lower", "upper" or "range"."""
    m = _OPERATOR.search(_STRING.sub("''", condition))
    if m is None:
        return ""
    op = " ".join(m.group(0).lower().split())
    if op in ("<>", "!=") or op.startswith("not") or op == "is not":
        return "not"
    return _KINDS.get(op, "")


def sql_key(condition: str) -> str:
    """The key of a WHERE condition (or of a SELECT convention, sql_select.py)."""
    if key := select_key(condition):
        return key
    cond = condition.removeprefix("WHERE ").strip()
    cols = columns(cond)
    kind = comparison(cond)
    key = "sql:" + ",".join(cols) if cols else "sql:" + cond.casefold()[:80]
    return f"{key}:{kind}" if kind and cols else key


def key_columns(key: str) -> set[str]:
    """The columns an `sql:` key names."""
    return set(key.removeprefix("sql:").partition(":")[0].split(","))


_DATE = re.compile(r"(?:\b(?:date|timestamp|timestamptz)\s*)?'\d{4}-\d{2}(?:-\d{2})?[^']*'", re.I)
_PERIOD_FUNCTION = re.compile(r"\b(?:date_trunc|extract|date_part|to_char|trunc)\s*\(", re.I)
_PERIOD_COLUMN = re.compile(
    r"^\s*(?:\w+\.)?(?:year|quarter|month|week|day|date|period|fiscal_\w+)\s*(?:=|in\b)", re.I
)


def _day(cond: str) -> str:
    """The first date literal's digits (`2024-04-01`), "" when there is none."""
    m = _DATE.search(cond)
    return re.sub(r"[^\d-]", "", m.group(0)) if m else ""


class Condition(NamedTuple):
    key: str
    text: str  # as shown: "Applied in SQL: ..."
    period: bool  # picks one period: what a question asks about, never promoted from SQL


def _one_period(cond: str, kind: str) -> bool:
    """Does a condition alone pick one period (an equality on a period, a range of dates)?"""
    if kind == "range":
        return bool(_DATE.search(cond) or _PERIOD_FUNCTION.search(cond))
    if kind == "":
        dated = _PERIOD_FUNCTION.search(cond) or _PERIOD_COLUMN.match(cond)
        return bool(dated or _DATE.search(cond))
    return False


# A fold parses each folded query more than once (the prompt's standing section, then
# carry_forward, then `holds` per standing condition): keep recent answers, bounded.
@lru_cache(maxsize=1024)
def sql_conditions(sql: str) -> tuple[Condition, ...]:
    """Each WHERE conjunct of a query: its key, its shown text, whether it picks a period (a
    lower and an upper date bound on the same columns together do too)."""
    flat = [one_line(c, 10 * MAX_CHARS) for cl in _where_clauses(sql) for c in _split_and(cl)]
    conds = [(sql_key(cond), cond, comparison(cond)) for cond in flat if cond]
    keys = {k for k, _, _ in conds}
    bounds = ("lower", "upper")
    dated = {k.rpartition(":")[0] for k, c, kind in conds if kind in bounds and _DATE.search(c)}
    closed = {col for col in dated if all(f"{col}:{b}" in keys for b in bounds)}
    # Of several lower bounds on a closed column, the latest starts the period (an earlier
    # one is the thread's start: "since 2024", then "Q2 2024").
    starts = {col: max(_day(c) for k, c, _ in conds if k == f"{col}:lower") for col in closed}

    def period(key: str, cond: str, kind: str) -> bool:
        col = key.rpartition(":")[0]
        if kind == "upper" or col not in closed:
            return _one_period(cond, kind) or (kind == "upper" and col in closed)
        return kind == "lower" and _day(cond) == starts[col]

    return tuple(
        Condition(key, one_line(SQL_PREFIX + cond, MAX_CHARS), period(key, cond, kind))
        for key, cond, kind in conds
    )


def _singular(word: str) -> str:
    if len(word) > 3 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def condition_values(text: str) -> set[str]:
    """Words of a condition's string values (`'residential'` -> {residential}); not of dates,
    numbers or intervals (`'30 days'` names no subject)."""
    values = [v for v in _STRING.findall(text.removeprefix(SQL_PREFIX)) if not v[1:2].isdigit()]
    return {_singular(w) for v in values for w in re.findall(r"[a-z]+", v.lower()) if len(w) > 2}


def condition_words(text: str) -> set[str]:
    """Words of a condition's columns (split at `_`) and of its string values."""
    cond = text.removeprefix(SQL_PREFIX)
    words = {_singular(w) for c in columns(cond) for w in c.split("_") if len(w) > 2}
    return words | condition_values(cond)


def revokes(subject_words: set[str], scope_kind: str | None, condition_text: str) -> bool:
    """Does a user instruction about `subject_words` (of kind `scope_kind`, for a scope)
    speak about this condition?"""
    words = condition_words(condition_text)
    if scope_kind is not None and words & SCOPE_COLUMNS.get(scope_kind, frozenset()):
        return True
    return bool({_singular(w) for w in subject_words} & words)


def holds(condition_text: str, sql: str) -> bool | None:
    """Does a query apply this very condition (same columns, comparison and value)? None when
    it does not touch the condition's table (its alias, or for an unqualified condition its
    columns, do not appear in the query)."""
    cond = condition_text.removeprefix(SQL_PREFIX)
    if select_key(cond) is not None:
        return selects(condition_text, sql)
    shown = one_line(SQL_PREFIX + cond, MAX_CHARS)
    if any(c.text == shown for c in sql_conditions(sql)):
        return True
    refs = qualifiers(cond)
    pattern = (
        r"\b(?:" + "|".join(map(re.escape, refs)) + r")\."
        if refs
        else r"\b(?:" + "|".join(map(re.escape, columns(cond))) + r")\b"
    )
    if pattern.endswith("(?:)\\b") or pattern.endswith("(?:)\\."):
        return None
    return False if re.search(pattern, _STRING.sub(" ", sql), re.I) else None
