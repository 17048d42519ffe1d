"""The standing instructions in force while a fold reads its turns, one per subject.

Read back from the previous summary, then updated turn by turn: a user instruction replaces
the one on the same subject (`instructions.same_subject`) and revokes the SQL conditions it
speaks about; a WHERE condition applied by two queries becomes standing (seen once, it waits in
`seen`); a standing condition that the fold's latest two queries on its table no longer apply
has been dropped by the agent, and goes too.

`InForce` judges the lines an LLM wrote against what this computed
(memory_core/fold/carry_forward.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memory_core.instructions.detect import (
    Instruction,
    content_words,
    key_of,
    same_subject,
    scope_kind,
)
from memory_core.instructions.patterns import SCOPE_RESET, STOP_WORDS
from memory_core.instructions.sql_conditions import (
    applies,
    condition_values,
    condition_words,
    revokes,
    sql_conditions,
)

# Later queries on a condition's table that must all leave it out before it is dropped.
UNAPPLIED_QUERIES = 2


def _speaks_about(ins: Instruction, condition: str) -> bool:
    kind, _, subject = ins.key.partition(":")
    if kind == "scope":
        return revokes(content_words(subject), scope_kind(ins.text) or subject, condition)
    if kind in ("filter", "define"):
        return revokes(content_words(subject), None, condition)
    return False


_AUX = frozenset(
    {"are", "was", "were", "been", "being", "has", "have", "had", "will", "shall", "should"}
    | {"must", "use", "used", "using"}
)


def stems(text: str) -> set[str]:
    """The words that carry a line's meaning, cut to 5 letters ("excluded" ~ "exclude")."""
    words = re.findall(r"[^\W_]+", text.casefold())
    return {
        w if w.isdigit() or len(w) < 5 else w[:5]
        for w in words
        if (w.isdigit() or len(w) > 2) and w not in STOP_WORDS and w not in _AUX
    }


def share(text: str, other: str) -> float:
    """Share of `text`'s words that `other` has."""
    mine = stems(text)
    return len(mine & stems(other)) / len(mine) if mine else 0.0


def _about(ins: Instruction, key: str, text: str, olds: list[str]) -> bool:
    """Is the instruction in force `text` (under `key`) about what `ins` sets, though under
    another key? It mostly repeats a wording `ins` just replaced (a model's rewording read
    back: "Active customers ordered within the last 90 days"), or, when code cannot key it
    ("No test accounts"), its words name the subject or mostly repeat `ins`."""
    if any(share(text, o) >= SAYS_OLD for o in olds):
        return True
    if not key.startswith("text:"):
        return False
    return names_subject(ins.key, text) or share(text, ins.text) >= SAYS_OLD


def names_subject(key: str, text: str) -> bool:
    """Does `text` name the subject of a filter, definition or scope `key`?"""
    kind, _, subject = key.partition(":")
    if kind in ("filter", "define") and subject:
        return content_words(subject) <= content_words(text)
    return kind == "scope" and bool(subject) and scope_kind(text) == subject


class Standing:
    """Instructions in force (one per key, oldest first) and SQL conditions seen once."""

    def __init__(self, instructions: list[str], seen: list[str]) -> None:
        self.items = {key_of(t): Instruction(key_of(t), t) for t in instructions}
        self.seen = {key_of(t): Instruction(key_of(t), t) for t in seen}
        self.revoked_columns: set[str] = set()
        self.replaced: list[str] = []  # wordings superseded in this fold, casefolded
        self._queries: list[str] = []
        self._applied_at: dict[str, int] = {}  # sql key -> index of the last query applying it
        self._lifts: list[int] = []  # queries seen when each take-back of this fold came

    def instruct(self, ins: Instruction) -> None:
        """A user instruction: it replaces the one on its subject and the conditions it
        speaks about."""
        if ins.lifts:
            self._lifts.append(len(self._queries))
        popped = [
            self.items.pop(k).text
            for k in list(self.items)
            if k == ins.key or same_subject(k, ins.key)
        ]
        # The same instruction read back in other words, under another key, goes too.
        others = [k for k in self.items if not k.startswith("sql:")]
        popped += [
            self.items.pop(k).text for k in others if _about(ins, k, self.items[k].text, popped)
        ]
        self.replaced += [t.casefold() for t in popped if t != ins.text]
        revoked: set[str] = set()
        revoked_values: set[str] = set()
        for table in (self.items, self.seen):
            for key in [k for k, v in table.items() if k.startswith("sql:")]:
                if _speaks_about(ins, table[key].text):
                    self.revoked_columns |= set(key.removeprefix("sql:").split(","))
                    text = table.pop(key).text
                    revoked |= condition_words(text)
                    revoked_values |= condition_values(text)
        # An instruction the revoked SQL applied goes with it: "all delivery modes" revokes
        # `co.mode = 'cohort'`, and so "only the cohort courses".
        self._drop_linked(revoked, revoked_values)
        self.items[ins.key] = ins

    def _drop_linked(self, words: set[str], values: set[str]) -> None:
        """User instructions a revoked condition applied: their subject names its columns or
        values, or their text names its values ("residential meters only" and
        `customer_class = 'residential'`)."""
        for key in [k for k in self.items if not k.startswith("sql:")]:
            subject = content_words(key.partition(":")[2])
            if words & subject or values & content_words(self.items[key].text):
                self.replaced.append(self.items.pop(key).text.casefold())

    def query(self, sql: str) -> None:
        """A query a turn ran: its conditions count as applied."""
        index = len(self._queries)
        self._queries.append(sql)
        for key, text in sql_conditions(sql):
            self._applied_at[key] = index
            if key in self.items or self.seen.pop(key, None) is not None:
                self.items.pop(key, None)
                self.items[key] = Instruction(key, text)  # applied twice: a convention
            else:
                self.seen[key] = Instruction(key, text)

    def drop_unapplied(self) -> None:
        """Standing conditions the latest queries on their table stopped applying. When the
        user took a restriction back in this fold before those queries ("the 22:00-06:00 crew
        counts again"), the instruction the condition applied ("the night shift is out") goes
        too: the take-back named it differently, the queries show which one it lifted."""
        for key in [k for k in self.items if k.startswith("sql:")]:
            text = self.items[key].text
            start = self._applied_at.get(key, -1) + 1
            touching = [q for q in self._queries[start:] if applies(text, q) is not None]
            if len(touching) >= UNAPPLIED_QUERIES and not any(applies(text, q) for q in touching):
                del self.items[key]
                if any(lift >= start for lift in self._lifts):  # after its last use
                    self._drop_linked(condition_words(text), condition_values(text))


# ---------------------------------------------------------------- the model's lines, judged

# Words that make a line history, not what holds now ("fiscal quarters no longer apply").
NO_LONGER = re.compile(
    r"\b(?:previously|no longer|superseded|replaced|instead of|used to|formerly|earlier"
    r"|originally|initially|at first)\b",
    re.I,
)
# A line outside the section longer than this is prose: left alone (it goes whole or not).
STATEMENT_WORDS = 30
# Share of a line's words found in a superseded wording for a line on another key (its own
# words: "Quarters are fiscal, starting in April") to count as saying it.
SAYS_OLD = 0.75
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
