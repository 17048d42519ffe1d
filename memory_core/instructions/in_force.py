"""The lines an LLM wrote in a summary, judged against the instructions code computed.

`InForce` holds the instructions in force after a fold and the wordings it superseded
(`llm_free.standing_after`); memory_core/fold/carry_forward.py asks it which of the model's lines
must go: one that still says what the folded turns superseded, or that contradicts an
instruction in force.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memory_core.instructions.detect import key_of, same_subject
from memory_core.instructions.patterns import SCOPE_RESET
from memory_core.instructions.standing import SAYS_OLD, names_subject, share

# Words that make a line history, not what holds now ("fiscal quarters no longer apply").
NO_LONGER = re.compile(
    r"\b(?:previously|no longer|superseded|replaced|instead of|used to|formerly|earlier"
    r"|originally|initially|at first)\b",
    re.I,
)
# A line outside the section longer than this is prose: left alone (it goes whole or not).
STATEMENT_WORDS = 30
# Share of words a line under an instruction's key must have in common with it to say it.
SAME_MATTER = 0.5
_LETS_IN = re.compile(
    r"\b(?:includ\w*|again|back|counts?|counted"
    r"|(?:no longer|stop|quit|don't|do not|never|not)\s+(?:be\s+)?"
    r"(?:exclud|leav|left|drop|remov|filter|omit|skip|ignor)\w*)\b",
    re.I,
)
_KEEPS_OUT = re.compile(
    r"\b(?:exclud\w*|leav\w*\s+out|left\s+out|drop\w*|remov\w*|without|filter\w*\s+out|omit\w*"
    r"|skip\w*|ignor\w*|no|not|except\w*|hid\w*)\b",
    re.I,
)
_SCOPE_ALL = re.compile(r"\b(?:all|every|global|worldwide|whole|any)\b", re.I)
_SCOPE_ONLY = re.compile(r"\b(?:only|just|exclusively|limit\w*|restrict\w*|focus\w*)\b", re.I)
# What an instruction's value is: a code (EUR, UTC), a number, a month, fiscal or calendar.
_CODE = re.compile(r"\b[A-Z]{3}\b")
_ACRONYMS = frozenset({"sql", "kpi", "api", "csv", "etl", "and", "the", "not", "for", "all"})
_VALUE = re.compile(
    r"\b(?:\d+(?:[.,]\d+)?|fiscal|calendar|january|february|march|april|june|july|august"
    r"|september|october|november|december|thousands?|millions?|billions?)\b",
    re.I,
)


def same_matter(text: str, instruction: str) -> bool:
    """Do a line and an instruction under the same key say the same thing, in any words?
    ("weeks start on Sunday" and "use fiscal quarters that start in April" do not: both are
    `calendar`.)"""
    return max(share(text, instruction), share(instruction, text)) >= SAME_MATTER


def keeps_out(key: str, text: str) -> bool | None:
    """Does `text` (on a filter or scope `key`) keep something out (True) or let it (back) in
    (False)? None when it does not say, or the key is of another kind."""
    kind = key.partition(":")[0]
    if kind == "filter":
        if _LETS_IN.search(text):
            return False
        return True if _KEEPS_OUT.search(text) else None
    if kind == "scope":
        if SCOPE_RESET.search(text) or _SCOPE_ALL.search(text):
            return False
        return True if _SCOPE_ONLY.search(text) else None
    return None


def values(text: str) -> set[str]:
    found = {v.casefold() for v in _CODE.findall(text)} - _ACRONYMS
    return found | {v.casefold() for v in _VALUE.findall(text)}


def contradicts(text: str, current: str) -> bool:
    """Does a line on the subject of the instruction `current` say otherwise: the other way
    round ("test accounts are excluded" / "include test accounts again"), or with a value
    the instruction does not name ("amounts in USD" / "show amounts in EUR")?"""
    key = key_of(current)
    mine, theirs = keeps_out(key, text), keeps_out(key, current)
    if mine is not None and theirs is not None and mine != theirs:
        return True
    named = values(text)
    return bool(named) and not named <= values(current)


@dataclass(frozen=True)
class _Change:
    old: str  # a wording the folded turns superseded (casefolded)
    key: str
    current: str | None  # what is in force on its subject now, if anything


class InForce:
    """The instructions in force after a fold and the wordings it superseded
    (`llm_free_fold.standing_after`), to judge the lines a model wrote."""

    def __init__(self, expected: list[str], replaced: list[str]) -> None:
        self.by_key = {key_of(t): t for t in expected}
        self.changes = [_Change(o, k, self.current(k)) for o in replaced for k in [key_of(o)]]

    def current(self, key: str) -> str | None:
        return next((t for k, t in self.by_key.items() if k == key or same_subject(k, key)), None)

    def removes(self, text: str, in_section: bool) -> bool:
        """Must this line of the model go? It says what the folded turns superseded (in the
        section: more like the old wording than the new, or the other way round from the
        new; elsewhere: mostly the old wording's words), or, in the section, it contradicts
        an instruction in force."""
        if not text or NO_LONGER.search(text) or len(text.split()) > STATEMENT_WORDS:
            return False
        if not self.changes and not in_section:
            return False
        key = key_of(text)
        current = self.current(key)
        for change in self.changes:
            similar = share(text, change.old)
            on_subject = key == change.key or same_subject(key, change.key)
            if key.startswith("text:") and names_subject(change.key, text):
                on_subject = True
            if current is not None and current == change.current:
                on_subject = True
            if not (on_subject or similar >= SAYS_OLD):
                continue
            new = change.current
            if new is None:  # the subject was dropped altogether
                stale = similar >= 0.5
            elif in_section:
                stale = similar > share(text, new) or contradicts(text, new)
            else:
                stale = similar >= 0.5 and similar > share(text, new)
            if stale:
                return True
        if not in_section or current is None:
            return False
        # One instruction per key is read back: another matter under its key would displace it.
        return contradicts(text, current) or (
            key == key_of(current) and not same_matter(text, current)
        )
