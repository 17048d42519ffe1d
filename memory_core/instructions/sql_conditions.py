"""WHERE conditions of the queries a thread ran: the instructions its artifacts applied.

Each top-level conjunct of a WHERE clause is one condition, keyed by the columns it tests
(`sql:country`, `sql:is_test`): a newer condition on the same columns replaces the older. A
user instruction that speaks about a condition's columns or values revokes it ("include test
accounts again" drops `NOT a.is_test` and `email NOT LIKE '%@test.com'`; a new region scope
drops `country IN (...)`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

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
    "now current_date date_trunc cast as case when then else end lower upper coalesce"
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


def sql_key(condition: str) -> str:
    cols = columns(condition.removeprefix("WHERE ").strip())
    return "sql:" + ",".join(cols) if cols else "sql:" + condition.casefold()[:80]


# A fold parses each folded query more than once (the prompt's standing section, then
# carry_forward, then `applies` per standing condition): keep recent answers, bounded.
@lru_cache(maxsize=1024)
def sql_conditions(sql: str) -> tuple[tuple[str, str], ...]:
    """(key, shown text) of each WHERE conjunct of a query."""
    return tuple(
        (sql_key(cond), one_line(SQL_PREFIX + cond, MAX_CHARS))
        for clause in _where_clauses(sql)
        for cond in _split_and(clause)
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


def applies(condition_text: str, sql: str) -> bool | None:
    """Does a query apply this condition? None when it does not touch the condition's table
    (its alias, or for an unqualified condition its columns, do not appear in the query)."""
    cond = condition_text.removeprefix(SQL_PREFIX)
    key = sql_key(cond)
    if any(k == key for k, _ in sql_conditions(sql)):
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
