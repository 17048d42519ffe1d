"""Conventions that live in a query's SELECT list: a time zone, a formula, a rounding, a column.

A WHERE condition shows a filter; what a user says about a time zone ("Berlin time"), a metric's
formula ("skip rate = skips / plays"), a rounding ("in k, one decimal") or a currency or unit
column shows only in the SELECT list. Each item of the outermost SELECT that computes something
(an operator, a FILTER, a CASE, a ROUND or a cast; not a bare column or a plain SUM of one) is a
feature keyed by its alias (`sql:select:skip_rate_pct`, shown `Applied in SQL: <expr> AS
skip_rate_pct`), and a time zone applied to a period is one keyed `sql:select:tz`.

They never stand from SQL alone: a metric's formula is the agent's, and which metrics a question
selects varies. They stand when a turn that set an instruction brought them in (standing.py): a
feature the turn's query changed, or one whose words the instruction names.
"""

from __future__ import annotations

import re
from functools import lru_cache

from memory_core.write.artifacts import one_line

SQL_PREFIX = "Applied in SQL: "
MAX_CHARS = 160
SELECT_KEY = "sql:select:"
TZ_KEY = SELECT_KEY + "tz"

_STRING = re.compile(r"'(?:[^']|'')*'")
_ALIAS = re.compile(r"^(?P<expr>.+?)\s+AS\s+(?P<alias>[A-Za-z_]\w*)$", re.I | re.S)
_TZ = re.compile(r"(?P<col>[A-Za-z_][\w.]*)\s+AT\s+TIME\s+ZONE\s+(?P<zone>'[^']*')", re.I)
# What makes an item a computation (a convention), not a plain read of a column.
_COMPUTES = re.compile(
    r"[-+*/]|::|\b(?:filter|case|round|nullif|coalesce|extract|epoch|cast|greatest|least)\b"
    r"|[<>=]",
    re.I,
)
_PERIOD = re.compile(r"\b(?:date_trunc|fiscal_\w+|extract)\s*\(", re.I)
_FEATURE = re.compile(r"^(?P<expr>.+) AS (?P<alias>[A-Za-z_]\w*)$", re.S)
_TZ_LINE = re.compile(r"^[A-Za-z_][\w.]* AT TIME ZONE '[^']*'$", re.I)


def _top_level(text: str, separator: str) -> list[str]:
    """`text` split at `separator` (one character) outside parentheses and string literals."""
    parts, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(text):
        if ch == "'":
            quoted = not quoted
        elif quoted:
            continue
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


# A SELECT list is read this far at most: a convention longer than a shown line (160
# characters) is not shown anyway, and a statement may be 50 000 characters (20 per turn).
MAX_SCAN = 4000


def _select_list(sql: str) -> str | None:
    """The outermost SELECT's list: from its SELECT to its FROM, outside parentheses (None
    when there is no SELECT, or no FROM within `MAX_SCAN` characters of it)."""
    m = re.search(r"\bselect\b", sql[: 2 * MAX_SCAN], re.I)
    if m is None:
        return None
    flat = " ".join(sql[m.start() : m.start() + 2 * MAX_SCAN].split())[:MAX_SCAN]
    depth, quoted, i = 0, False, len("select")
    while i < len(flat):
        ch = flat[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif depth == 0 and flat[i - 1] == " " and flat[i : i + 4].lower() == "from":
                return flat[len("select") : i] if not flat[i + 4 : i + 5].isalnum() else None
        i += 1
    return None


def _plain_aggregate(expr: str) -> bool:
    """`SUM(o.amount)`, `COUNT(*)`, `COUNT(DISTINCT c.id)`: a read, not a formula."""
    return re.fullmatch(r"\w+\(\s*(?:distinct\s+)?[\w.*]+\s*\)", expr, re.I) is not None


def select_features(sql: str) -> tuple[tuple[str, str], ...]:
    """(key, shown text) of each convention in a query's SELECT list."""
    return _parsed(sql)[0]


# A fold reads each query's SELECT list once per condition it checks: keep recent answers.
@lru_cache(maxsize=1024)
def _parsed(sql: str) -> tuple[tuple[tuple[str, str], ...], frozenset[str], bool]:
    """(features, the aliases the SELECT list names, whether it computes a period)."""
    items = _select_list(sql)
    if not items:
        return (), frozenset(), False
    found: dict[str, str] = {}
    aliases: set[str] = set()
    parts = _top_level(items, ",")
    for item in parts:
        if named := re.search(r"\bAS\s+([A-Za-z_]\w*)\s*$", item, re.I):
            aliases.add(named[1].lower())
        if tz := _TZ.search(item):
            found[TZ_KEY] = f"{tz['col']} AT TIME ZONE {tz['zone']}"
        m = _ALIAS.match(item)
        if m is None or _plain_aggregate(m["expr"].strip()):
            continue
        expr = m["expr"].strip()
        if _COMPUTES.search(_STRING.sub("''", expr)) and not _TZ.search(expr):
            found[f"sql:select:{m['alias'].lower()}"] = f"{expr} AS {m['alias']}"
    features = tuple((k, one_line(SQL_PREFIX + v, MAX_CHARS)) for k, v in found.items())
    return features, frozenset(aliases), bool(_PERIOD.search(items))


def select_key(feature: str) -> str | None:
    """The key of a feature's text (without the prefix), or None when it is not one."""
    text = feature.strip()
    if _TZ_LINE.match(text):
        return TZ_KEY
    m = _FEATURE.match(text)
    if m is None or not _COMPUTES.search(_STRING.sub("''", m["expr"])):
        return None
    return f"sql:select:{m['alias'].lower()}"


def selects(feature_text: str, sql: str) -> bool | None:
    """Does a query apply this feature? None when it does not select its alias (for the time
    zone: when it computes no period)."""
    key = select_key(feature_text.removeprefix(SQL_PREFIX))
    if key is None:
        return None
    features, aliases, period = _parsed(sql)
    if dict(features).get(key) == one_line(feature_text, MAX_CHARS):
        return True
    if key == TZ_KEY:
        return False if period else None
    return False if key.removeprefix(SELECT_KEY) in aliases else None


def identifiers(text: str) -> set[str]:
    """The qualified columns a feature reads (`o.amount_gbp`), lower case."""
    body = _STRING.sub(" ", text.removeprefix(SQL_PREFIX))
    return {n.lower() for n in re.findall(r"\b[A-Za-z_]\w*\.[A-Za-z_]\w*", body)}


def feature_words(text: str) -> set[str]:
    """Words of a feature's columns and alias (`sa.cogs_eur` -> cogs, eur), for telling
    whether an instruction names it."""
    body = _STRING.sub(" ", text.removeprefix(SQL_PREFIX))
    names = re.findall(r"[A-Za-z_][\w.]*", body)
    words = {w for n in names for w in n.split(".")[-1].lower().split("_") if len(w) > 2}
    return words - _NOISE


_NOISE = frozenset(
    {
        "as",
        "and",
        "or",
        "not",
        "sum",
        "count",
        "avg",
        "min",
        "max",
        "round",
        "nullif",
        "coalesce",
        "filter",
        "where",
        "case",
        "when",
        "then",
        "else",
        "end",
        "distinct",
        "cast",
        "int",
        "numeric",
        "float",
        "extract",
        "epoch",
        "from",
        "interval",
        "date",
        "time",
        "zone",
        "at",
        "is",
        "null",
        "true",
        "false",
        "pct",
    }
)
