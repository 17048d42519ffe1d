"""The standing instructions in force while a fold reads its turns, one per subject.

Read back from the previous summary, then updated turn by turn: a user instruction replaces
the one on the same subject (`instructions.same_subject`) and revokes the SQL conditions it
speaks about; a WHERE condition applied by two queries becomes standing (seen once, it waits in
`seen`); a standing condition that the fold's latest two queries on its table no longer apply
has been dropped by the agent, and goes too.
"""

from __future__ import annotations

from memory_core.instructions import Instruction, content_words, key_of, same_subject, scope_kind
from memory_core.sql_conditions import (
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
        for key in [k for k in self.items if k == ins.key or same_subject(k, ins.key)]:
            old = self.items.pop(key)
            if old.text != ins.text:
                self.replaced.append(old.text.casefold())
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
