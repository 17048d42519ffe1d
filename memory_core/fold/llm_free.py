"""The LLM-free fold: a deterministic summary led by the thread's standing instructions.

Used when no LLM is configured and as the fallback when the LLM keeps failing or its answers
are unusable (folding.py): it never calls out, so a fold always completes. Sections, in the
order a view shows them (a view cuts a summary from its end, so what matters most comes first):

- `Standing instructions:` filters, definitions, scopes and conventions the user set
  (memory_core/instructions/detect.py), one per key, newest wording winning; a superseded one is
  gone, and so are the SQL conditions and built queries it revoked. WHERE conditions join them
  (`Applied in SQL: ...`) when a turn that set an instruction brought them in, or when enough
  queries in a row applied them with the same value (memory_core/instructions/standing.py).
- `Earlier context:` free text read back from an earlier LLM summary.
- `Goals:` and `Built:` one line per turn / artifact.
- `Query filters:` WHERE conditions not standing yet, each with the queries in a row that
  applied it (a per-question choice stays here, or goes).

Over the bound, the oldest entries go first: earlier context, then goals, built and query
filters down to their newest three, then those too; standing instructions are trimmed last.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memory_core.copy.context import Exchange
from memory_core.instructions.declared import declarations, parse_line
from memory_core.instructions.detect import Instruction, content_words, detect, states
from memory_core.instructions.sql_conditions import SQL_PREFIX
from memory_core.instructions.standing import Standing
from memory_core.tokens import count_tokens, truncate_to_tokens
from memory_core.write.artifacts import one_line

LLM_FREE_LABEL = "llm-free:v2"
INSTRUCTIONS_HEADER = "Standing instructions:"
_MAX_ITEM_CHARS = 160
_MAX_ITEMS = 25
_MAX_INSTRUCTIONS = 40

_HEADERS = {
    "instructions": INSTRUCTIONS_HEADER,
    "earlier": "Earlier context:",
    "goals": "Goals:",
    "built": "Built:",
    "seen": "Query filters:",
}
_ORDER = ("instructions", "earlier", "goals", "built", "seen")
# Headers of earlier versions, read back into today's sections.
_OLD_HEADERS = {"filters and definitions:": "instructions"}
_POLITE = re.compile(r"^(?:please|can you|could you|would you|now|ok(?:ay)?|and)\b[\s,]*", re.I)


def _goal(query: str) -> str:
    text = " ".join(query.split())
    while (stripped := _POLITE.sub("", text)) != text:
        text = stripped
    text = text[:1].upper() + text[1:]
    return one_line(text, _MAX_ITEM_CHARS)


def _goal_besides(query: str, found: list[Instruction]) -> str | None:
    """The turn's goal line without its instructions (they live in their own section)."""
    text = _goal(query) if query.strip() else ""
    for ins in found:
        at = text.casefold().find(ins.text.casefold())
        if at >= 0:
            text = text[:at] + text[at + len(ins.text) :]
    if len(content_words(text)) < 2:
        return None
    text = text.strip(" ,.;:!?-")
    return text[:1].upper() + text[1:]


_ITEM = re.compile(r"^(?:[-*\u2022]|\d+[.)])\s+")


def parse_sections(summary: str | None) -> dict[str, list[str]]:
    """A summary's lines by section; lines outside our sections (LLM prose) are `earlier`.

    Headers are recognised also in an LLM's markdown (`**Standing instructions:**`, `## ...`)."""
    sections: dict[str, list[str]] = {key: [] for key in _ORDER}
    by_header = {h.lower(): k for k, h in _HEADERS.items()} | _OLD_HEADERS
    current: str | None = None
    for raw in (summary or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        header = line.lstrip("#* ").rstrip("* ").lower()
        if header in by_header:
            current = by_header[header]
        elif current is not None and (item := _ITEM.match(line)):
            sections[current].append(line[item.end() :].strip())
        else:
            current = None
            sections["earlier"].append(one_line(_ITEM.sub("", line), 2 * _MAX_ITEM_CHARS))
    return sections


def _revoked_query(line: str, columns: set[str]) -> bool:
    if not line.startswith("SQL:") or not columns:
        return False
    return any(re.search(rf"\b{re.escape(c)}\b", line, re.I) for c in columns if c)


def _merge(items: list[str], limit: int = _MAX_ITEMS) -> list[str]:
    """Dedupe case-insensitively keeping the latest occurrence (oldest first order)."""
    seen: set[str] = set()
    out: list[str] = []
    for item in reversed(items):
        key = " ".join(item.casefold().split())
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out[::-1][-limit:]


def _render(sections: dict[str, list[str]]) -> str:
    parts = [
        "\n".join([_HEADERS[k], *(f"- {i}" for i in sections[k])]) for k in _ORDER if sections[k]
    ]
    return "\n\n".join(parts)


LLM_FREE_TARGET_TOKENS = 500


def _fold_pass(
    previous_summary: str | None, exchanges: Sequence[Exchange]
) -> tuple[dict[str, list[str]], Standing]:
    sections = parse_sections(previous_summary)
    standing = Standing(sections["instructions"], sections["seen"])
    for ex in exchanges:
        declared = declarations(ex)
        found = detect(ex.user_query) if declared is None else []
        if declared is not None and declared.items:
            # Its line says what the turn set (no goal quoting it); a change of what stood
            # retires the SQL built under the old rules.
            if standing.declare(declared.items):
                sections["built"] = [b for b in sections["built"] if not b.startswith("SQL:")]
        elif goal := _goal_besides(ex.user_query, found):
            sections["goals"].append(goal)
        for ins in found:
            standing.instruct(ins)
        for art in ex.artifacts:
            if art.kind == "sql" and declared is None:
                standing.query(art.sql, found, states(ex.user_query))
            if art.kind != "standing":
                sections["built"].append(art.one_line())
    standing.drop_unapplied()
    cols, old = standing.revoked_columns, standing.replaced
    sections["built"] = [b for b in sections["built"] if not _revoked_query(b, cols)]
    # A goal that quoted a superseded instruction would present it as current.
    sections["goals"] = [g for g in sections["goals"] if not any(o in g.casefold() for o in old)]
    sections["instructions"] = standing.lines()[-_MAX_INSTRUCTIONS:]
    sections["seen"] = standing.seen_lines()[-_MAX_ITEMS:]
    for key in ("earlier", "goals", "built"):
        sections[key] = _merge(sections[key])
    return sections, standing


def fold_sections(
    previous_summary: str | None, exchanges: Sequence[Exchange]
) -> dict[str, list[str]]:
    """The sections of the folded summary, before any trimming to a bound."""
    return _fold_pass(previous_summary, exchanges)[0]


def standing_after(
    previous_summary: str | None, exchanges: Sequence[Exchange]
) -> tuple[list[str], list[str]]:
    """(instructions in force after folding `exchanges`, wordings they superseded)."""
    sections, standing = _fold_pass(previous_summary, exchanges)
    return sections["instructions"], standing.replaced


def llm_free_fold(
    previous_summary: str | None, exchanges: Sequence[Exchange], max_tokens: int
) -> str:
    """Deterministic fold led by the standing instructions, within max_tokens."""
    sections = fold_sections(previous_summary, exchanges)
    passes = [("earlier", 0), ("seen", 0), ("goals", 3), ("built", 3)]
    passes += [("goals", 0), ("built", 0), ("instructions", 0)]
    text = _render(sections)
    for key, keep in passes:
        while count_tokens(text) > max_tokens and len(sections[key]) > keep:
            # SQL conditions of the standing section go before what the user said; what an
            # agent declared never (memory_core/instructions/declared.py bounds it).
            items = sections[key]
            if key == "instructions":
                sql = [i for i, t in enumerate(items) if t.startswith(SQL_PREFIX)]
                said = [i for i, t in enumerate(items) if parse_line(t) is None]
                if not (sql or said):
                    break
                items.pop((sql or said)[0])
            else:
                items.pop(0)
            text = _render(sections)
    if count_tokens(text) > max_tokens and not any(map(parse_line, sections["instructions"])):
        text = truncate_to_tokens(text, max_tokens).strip()  # only with absurdly small bounds
    return text


__all__ = [
    "INSTRUCTIONS_HEADER",
    "LLM_FREE_LABEL",
    "LLM_FREE_TARGET_TOKENS",
    "fold_sections",
    "llm_free_fold",
    "parse_sections",
    "standing_after",
]
