"""Scoring a rendered view against a conversation's facts.

An established fact is kept when its probe (a case-insensitive regex over the instruction's
content, in words or as applied in SQL) matches the view. A superseded fact is wrongly current
when its probe matches a line of the view that does not say the instruction no longer applies
(`MARKER`: previously, no longer, superseded, replaced, instead of, used to). A per-question
choice (a value, a quarter or a top N the user picked for one question) is falsely standing
when its probe matches a line of the view's standing-instructions section: a SQL generator
reading that section would apply it to the next question.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memory_core.eval.corpus import Conversation

STANDING_HEADER = "standing instructions:"
MARKER = re.compile(
    r"\b(previously|no\s+longer|superseded|replac(ed|es|ing)|instead\s+of|used\s+to)\b",
    re.IGNORECASE,
)


def probe_matches(probe: str, text: str) -> bool:
    return re.search(probe, text, re.IGNORECASE) is not None


def current_lines(probe: str, text: str) -> list[str]:
    """Lines of `text` where `probe` matches and no no-longer-applies marker stands."""
    return [
        line
        for line in text.splitlines()
        if probe_matches(probe, line) and MARKER.search(line) is None
    ]


def standing_lines(view: str) -> list[str]:
    """The item lines of every `Standing instructions:` section of a view."""
    lines: list[str] = []
    inside = False
    for raw in view.splitlines():
        line = raw.strip()
        if line.lstrip("#* ").rstrip("* ").casefold() == STANDING_HEADER:
            inside = True
        elif inside and line.startswith(("- ", "* ")):
            lines.append(line[2:])
        else:
            inside = False
    return lines


@dataclass
class ViewScore:
    kept: list[str] = field(default_factory=list)  # established fact ids found
    missed: list[str] = field(default_factory=list)  # established fact ids not found
    current: list[str] = field(default_factory=list)  # superseded fact ids still current
    false_standing: list[str] = field(default_factory=list)  # per-question ids shown standing


def score_view(conversation: Conversation, view: str) -> ViewScore:
    score = ViewScore()
    for fact in conversation.established:
        (score.kept if probe_matches(fact.probe, view) else score.missed).append(fact.id)
    score.current = [f.id for f in conversation.superseded if current_lines(f.probe, view)]
    section = standing_lines(view)
    score.false_standing = [
        pid
        for pid, probe in conversation.per_question
        if any(probe_matches(probe, line) for line in section)
    ]
    return score
