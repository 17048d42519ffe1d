"""The LLM-free fold: a deterministic summary of goals, filters/definitions and what was built.

Used when no LLM is configured and as the fallback when the LLM keeps failing or its answers
are unusable (folding.py): it never calls out, so a fold always completes. It reads the
previous summary back (its own sections, or free text from an earlier LLM summary) and drops
the oldest entries first to stay within the bound.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memory_core.artifacts import one_line
from memory_core.context import Exchange
from memory_core.tokens import count_tokens, truncate_to_tokens

LLM_FREE_LABEL = "llm-free:v1"
_MAX_ITEM_CHARS = 160
_MAX_ITEMS = 25


def _clip(text: str, limit: int) -> str:
    return one_line(text, limit)


_HEADERS = {
    "goals": "Goals:",
    "filters": "Filters and definitions:",
    "built": "Built:",
    "earlier": "Earlier context:",
}
_ORDER = ("earlier", "goals", "filters", "built")
_SQL_STOP = re.compile(
    r"\b(?:group\s+by|order\s+by|having|limit|union|window|qualify|offset|fetch)\b", re.I
)
_PHRASES = re.compile(
    r"\b(?:define[sd]?\b[^.;?!\n]*?\bas\b[^.;?!\n]*|defined as\b[^.;?!\n]*"
    r"|(?:excluding|exclude[sd]?|except|without|not including|ignoring|only|where"
    r"|filter(?:ed)? (?:by|to|on)|limited to|restricted to)\b[^.;,?!\n]*)",
    re.I,
)
_POLITE = re.compile(r"^(?:please|can you|could you|would you|now|ok(?:ay)?|and)\b[\s,]*", re.I)


def _sql_filters(sql: str) -> list[str]:
    flat = " ".join(sql.split())
    out = []
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
        clause = flat[m.end() : i].strip()
        if clause:
            out.append(_clip(f"WHERE {clause}", _MAX_ITEM_CHARS))
    return out


def _goal(query: str) -> str:
    text = " ".join(query.split())
    while (stripped := _POLITE.sub("", text)) != text:
        text = stripped
    text = text[:1].upper() + text[1:]
    return _clip(text, _MAX_ITEM_CHARS)


def _parse_summary(summary: str | None) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {key: [] for key in _ORDER}
    by_header = {h.lower(): k for k, h in _HEADERS.items()}
    current: str | None = None
    for raw in (summary or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.lower() in by_header:
            current = by_header[line.lower()]
        elif current is not None and line.startswith("- "):
            sections[current].append(line[2:].strip())
        else:  # free text (e.g. an earlier LLM summary): kept, dropped first when short
            current = None
            sections["earlier"].append(_clip(line.removeprefix("- "), 2 * _MAX_ITEM_CHARS))
    return sections


def _merge(items: list[str]) -> list[str]:
    """Dedupe case-insensitively keeping the latest occurrence (oldest first order)."""
    seen: set[str] = set()
    out: list[str] = []
    for item in reversed(items):
        key = " ".join(item.casefold().split())
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out[::-1][-_MAX_ITEMS:]


def _render(sections: dict[str, list[str]]) -> str:
    parts = [
        "\n".join([_HEADERS[k], *(f"- {i}" for i in sections[k])]) for k in _ORDER if sections[k]
    ]
    return "\n\n".join(parts)


LLM_FREE_TARGET_TOKENS = 500


def llm_free_fold(
    previous_summary: str | None, exchanges: Sequence[Exchange], max_tokens: int
) -> str:
    """Deterministic fold: goals, filters/definitions and what was built, within max_tokens."""
    sections = _parse_summary(previous_summary)
    for ex in exchanges:
        if ex.user_query.strip():
            sections["goals"].append(_goal(ex.user_query))
        sections["filters"].extend(
            _clip(m.group(0), _MAX_ITEM_CHARS) for m in _PHRASES.finditer(ex.user_query)
        )
        for art in ex.artifacts:
            if art.kind == "sql":
                sections["filters"].extend(_sql_filters(art.sql))
            sections["built"].append(art.one_line())
    sections = {k: _merge(v) for k, v in sections.items()}
    # Over the bound: drop the oldest entries, goals first; keep the newest few of each
    # section as long as possible.
    passes = [("earlier", 0), ("goals", 3), ("built", 3), ("filters", 3)]
    passes += [("goals", 0), ("built", 0), ("filters", 0)]
    text = _render(sections)
    for key, keep in passes:
        while count_tokens(text) > max_tokens and len(sections[key]) > keep:
            sections[key].pop(0)
            text = _render(sections)
    if count_tokens(text) > max_tokens:  # only with absurdly small bounds
        text = truncate_to_tokens(text, max_tokens).strip()
    return text
