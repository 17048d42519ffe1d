"""Scoring a rendered view against a conversation's facts.

An established fact is kept when its probe (a case-insensitive regex over the instruction's
content, in words or as applied in SQL) matches the view. A superseded fact is wrongly current
when its probe matches a line of the view that does not say the instruction no longer applies
(`MARKER`: previously, no longer, superseded, replaced, instead of, used to).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memory_core.eval.corpus import Conversation

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


@dataclass
class ViewScore:
    kept: list[str] = field(default_factory=list)  # established fact ids found
    missed: list[str] = field(default_factory=list)  # established fact ids not found
    current: list[str] = field(default_factory=list)  # superseded fact ids still current


def score_view(conversation: Conversation, view: str) -> ViewScore:
    score = ViewScore()
    for fact in conversation.established:
        (score.kept if probe_matches(fact.probe, view) else score.missed).append(fact.id)
    score.current = [f.id for f in conversation.superseded if current_lines(f.probe, view)]
    return score
