"""Standing instructions an agent declared (`TurnSnapshot.standing_instructions`).

The agent that produced a turn knows what its planner applied; when it says so, memory keeps
its words verbatim instead of guessing from the user's. A declaration is a subject and a text
(one line each, bounded by the snapshot); a text of null withdraws the subject. In the
summary's `Standing instructions:` section a declared instruction is one line,
`Declared (<subject>): <text>`, ahead of anything detected, newest wording per subject: a later
declaration on the same subject (compared case-insensitively) replaces the earlier one, and
at most `MAX_IN_FORCE` subjects stand at once (the oldest goes first).

A turn that declares (even an empty list) is not read for instructions in its words, nor does
its SQL promote conditions: the agent said what stands (memory_core/instructions/standing.py).
A view applies the declarations of turns not folded yet over its summary's section
(`apply_recent`), so the newest wording is the one a node reads as soon as the turn is saved.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from memory_core.copy.context import Exchange
from memory_core.write.artifacts import StandingArtifact
from memory_core.write.snapshot import subject_key

KEY_PREFIX = "declared:"
MAX_IN_FORCE = 20
_LINE = re.compile(r"^Declared \((?P<subject>[^():\n]{1,80})\): (?P<text>\S.*)$")
_HEADER = "standing instructions:"
_ITEM = re.compile(r"^(\s*)(?:[-*\u2022]|\d+[.)])\s+")


def declared_line(subject: str, text: str) -> str:
    return f"Declared ({subject}): {text}"


def parse_line(line: str) -> tuple[str, str] | None:
    """(subject, text) of a declared line, or None when it is not one."""
    m = _LINE.match(line.strip())
    return (m["subject"], m["text"]) if m else None


def declared_key(subject: str) -> str:
    return KEY_PREFIX + subject_key(subject)


def declarations(exchange: Exchange) -> StandingArtifact | None:
    """The turn's declaration, or None when its agent declared nothing."""
    return next((a for a in exchange.artifacts if isinstance(a, StandingArtifact)), None)


def newest(turns: Iterable[Exchange]) -> dict[str, tuple[str, str | None]]:
    """Subject key -> (subject, text or None) of every subject the turns declared, newest
    declaration winning."""
    out: dict[str, tuple[str, str | None]] = {}
    for turn in turns:
        if (found := declarations(turn)) is not None:
            for d in found.items:
                out.pop(declared_key(d.subject), None)
                out[declared_key(d.subject)] = (d.subject, d.text)
    return out


def _is_header(line: str) -> bool:
    return line.strip().lstrip("#* ").rstrip("* ").casefold() == _HEADER


def apply_recent(summary: str | None, recent: Sequence[Exchange]) -> str | None:
    """`summary` with the declarations of `recent` (turns not folded yet) applied to its
    standing-instructions section: a subject they declared loses its older line, and their
    newest wording (unless withdrawn) leads the section. Unchanged when they declare
    nothing."""
    latest = newest(recent)
    if not latest:
        return summary
    lines = (summary or "").splitlines()
    header = next((i for i, line in enumerate(lines) if _is_header(line)), None)
    if header is None:
        lines = ["Standing instructions:", *([""] if lines else []), *lines]
        header = 0
    kept = [
        line
        for i, line in enumerate(lines)
        if i <= header or not _stale(line, latest) or not _in_section(lines, header, i)
    ]
    fresh = [f"- {declared_line(s, t)}" for s, t in latest.values() if t is not None]
    return "\n".join([*kept[: header + 1], *fresh, *kept[header + 1 :]]).strip("\n")


def _stale(line: str, latest: dict[str, tuple[str, str | None]]) -> bool:
    found = parse_line(_ITEM.sub("", line))
    return found is not None and declared_key(found[0]) in latest


def _in_section(lines: list[str], header: int, index: int) -> bool:
    """Is line `index` an item of the section that starts at `header`?"""
    return all(_ITEM.match(line) or not line.strip() for line in lines[header + 1 : index + 1])


def in_force(items: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The newest `MAX_IN_FORCE` (key, line) pairs."""
    return list(items)[-MAX_IN_FORCE:]
