"""The standing instructions in force while a fold reads its turns, one per subject.

Read back from the previous summary, then updated turn by turn: a user instruction replaces
the one on the same subject (`instructions.same_subject`) and revokes the SQL conditions it
speaks about; a WHERE condition becomes standing once `SQL_STANDING_QUERIES` queries in a row on
its table applied it with the same value (until then it waits in `seen`, with its count; a
value that changes or a query that leaves it out is a per-question choice, and it starts
again); a condition that picks one period never stands from SQL alone; a standing condition
that the fold's latest two queries on its table no longer apply (left out, or with another
value) has been dropped by the agent, and goes too.

in_force.py judges the lines an LLM wrote against what this computed
(memory_core/fold/carry_forward.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memory_core.instructions.declared import (
    KEY_PREFIX,
    MAX_IN_FORCE,
    declared_key,
    declared_line,
)
from memory_core.instructions.detect import (
    Instruction,
    content_words,
    key_of,
    same_subject,
    scope_kind,
)
from memory_core.instructions.patterns import STOP_WORDS
from memory_core.instructions.sql_conditions import (
    condition_values,
    condition_words,
    holds,
    key_columns,
    revokes,
    sql_conditions,
)
from memory_core.instructions.sql_select import (
    SELECT_KEY,
    TZ_KEY,
    feature_words,
    identifiers,
    select_features,
)
from memory_core.write.artifacts import Declared

# Share of a line's words found in a superseded wording for a line on another key (its own
# words: "Quarters are fiscal, starting in April") to count as saying it.
SAYS_OLD = 0.75
# Later queries on a condition's table that must all leave it out before it is dropped.
UNAPPLIED_QUERIES = 2
# Words of a changed condition's columns an instruction must share to be what it replaced.
_NAMES_IT = 2
# Queries in a row on its table that must apply a WHERE condition with the same value before it
# stands (docs/ARCHITECTURE.md, "Standing instructions"): fewer, it is a per-question choice.
SQL_STANDING_QUERIES = 4


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


def feature_stems(text: str) -> set[str]:
    """The words of a SELECT convention's columns and alias, cut as `stems` cuts."""
    return {w if len(w) < 5 else w[:5] for w in feature_words(text)}


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
    """Instructions in force (one per key, oldest first) and SQL conditions not standing yet,
    with how many queries in a row have applied each (`counts`)."""

    def __init__(self, instructions: list[str], seen: list[str]) -> None:
        self.items = {key_of(t): Instruction(key_of(t), t) for t in instructions}
        self.seen: dict[str, Instruction] = {}
        self.counts: dict[str, int] = {}
        for line in seen:
            text, count = parse_seen(line)
            self.seen[key_of(text)] = Instruction(key_of(text), text)
            self.counts[key_of(text)] = count
        self.revoked_columns: set[str] = set()
        self.replaced: list[str] = []  # wordings superseded in this fold, casefolded
        self._queries: list[str] = []
        self._applied_at: dict[str, int] = {}  # sql key -> index of the last query applying it
        self._lifts: list[int] = []  # queries seen when each take-back of this fold came
        self._selects: dict[str, str] = {}  # SELECT conventions this fold's queries applied

    def seen_lines(self) -> list[str]:
        """The conditions not standing yet, as the summary's `Query filters:` keeps them."""
        return [seen_line(i.text, self.counts.get(k, 1)) for k, i in self.seen.items()]

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
        # The SELECT conventions a replaced instruction or this one names go ("use fiscal
        # quarters" and `fiscal_quarter(...)`, "forget the SEK" and `SUM(t.amount_sek)`):
        # the turn's query brings the ones in force now.
        named = {w for t in [*popped, ins.text] for w in stems(t)}
        for key in [k for k in self.items if k.startswith(SELECT_KEY)]:
            if named & feature_stems(self.items[key].text):
                del self.items[key]
        revoked: set[str] = set()
        revoked_values: set[str] = set()
        for table in (self.items, self.seen):
            for key in [k for k, v in table.items() if k.startswith("sql:")]:
                if _speaks_about(ins, table[key].text):
                    self.revoked_columns |= key_columns(key)
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

    def declare(self, items: Sequence[Declared]) -> bool:
        """A turn's declarations (declared.py): each replaces its subject's line, a null
        text withdraws it, and a detected instruction on the same matter goes. True when one
        changed or withdrew what stood."""
        changed = False
        for d in items:
            key = declared_key(d.subject)
            line = declared_line(d.subject, d.text) if d.text is not None else None
            old = self.items.pop(key, None)
            if old is not None and old.text != line:
                changed = True
                self.replaced.append(old.text.casefold())
            if line is None or d.text is None:
                continue
            matter = key_of(d.text)
            for k in [k for k in self.items if not k.startswith((KEY_PREFIX, "sql:"))]:
                if k == matter or same_subject(k, matter):
                    self.replaced.append(self.items.pop(k).text.casefold())
            self.items[key] = Instruction(key, line)
        for k in [k for k in self.items if k.startswith(KEY_PREFIX)][:-MAX_IN_FORCE]:
            del self.items[k]
        return changed

    def lines(self) -> list[str]:
        """The section's lines: declared ones first, then the rest, oldest first."""
        declared = [i.text for k, i in self.items.items() if k.startswith(KEY_PREFIX)]
        return declared + [i.text for k, i in self.items.items() if not k.startswith(KEY_PREFIX)]

    def query(self, sql: str, said: Sequence[Instruction] = (), stated: bool = False) -> None:
        """A query a turn ran; `said`: the instructions its user message set, `stated`: the
        message states something, found or not (`detect.states`). A
        condition it applies that is standing already stays; one the query brings in when the
        user stated something stands at once (the user set it); any other counts one more
        query in a row, and stands once `SQL_STANDING_QUERIES` queries in a row on its table
        have applied it with the same value (a value that changes, or that a query on its
        table leaves out, starts again: a per-question choice). A condition that picks one
        period never stands from SQL alone, nor, on a statement the detector found nothing in,
        a pick of a value (an equality: it may be one question's). Its SELECT conventions
        stand only when the user stated something (`_selected`)."""
        index = len(self._queries)
        self._queries.append(sql)
        conditions = sql_conditions(sql)
        for cond in conditions:
            key, text = cond.key, cond.text
            if key in self.items and self.items[key].text == text:
                self._applied_at[key] = index
                self.items[key] = self.items.pop(key)  # still applied: newest last
                continue
            if cond.period:
                continue
            same = key in self.seen and self.seen[key].text == text
            count = self.counts.get(key, 0) + 1 if same else 1
            picks = not key.endswith((":not", ":lower", ":upper", ":range"))
            if count >= SQL_STANDING_QUERIES or (not same and (said or (stated and not picks))):
                old = self.items.get(key)
                self._stand(key, text, index)
                if old is not None and (said or stated):  # the user changed it: see _replaced
                    self._replaced(condition_words(old.text), condition_values(old.text), said)
            else:
                self.seen.pop(key, None)
                self.seen[key], self.counts[key] = Instruction(key, text), count
        applied = {c.key for c in conditions}
        for key in [k for k in self.seen if k not in applied]:
            if holds(self.seen[key].text, sql) is False:  # its table, without it: not a rule
                del self.seen[key]
                self.counts.pop(key, None)
        self._selected(sql, said, stated, index)

    def _selected(self, sql: str, said: Sequence[Instruction], stated: bool, index: int) -> None:
        """The query's SELECT conventions (sql_select.py). One standing already stays. A
        formula seen for the first time is the agent's own and stays out, one that changed
        (another expression under an alias selected before, a time zone) is a candidate
        that stands after `SQL_STANDING_QUERIES` queries in a row; when the user stated
        something in this turn, either stands at once: the user set it. What a stated change
        took out of an expression (`o.amount_gbp` for `o.amount_usd`) retires the other
        standing conventions built on it."""
        words = {w for ins in said for w in stems(ins.text)}
        for key, text in select_features(sql):
            current = self.items.get(key)
            if current is not None and current.text == text:
                self._applied_at[key] = index
                self.items[key] = self.items.pop(key)
                continue
            before, self._selects[key] = self._selects.get(key), text
            candidate = self.seen.get(key)
            if candidate is not None and candidate.text == text:
                count = self.counts.get(key, 1) + 1
            else:
                changed = current or candidate or key == TZ_KEY or before not in (None, text)
                count = 1 if changed else 0
            first = before is None and current is None and candidate is None
            named = bool(words & feature_stems(text))
            if ((said or stated) and (count or named or first)) or count >= SQL_STANDING_QUERIES:
                self._stand(key, text, index)
                old = current.text if current is not None else before
                if old is not None and (said or stated):
                    self._retire(identifiers(old) - identifiers(text), keep=key)
                    self._replaced(feature_words(old), set(), said)
            elif count:
                self.seen.pop(key, None)
                self.seen[key], self.counts[key] = Instruction(key, text), count

    def _stand(self, key: str, text: str, index: int) -> None:
        self.seen.pop(key, None)
        self.counts.pop(key, None)
        self.items.pop(key, None)
        self.items[key] = Instruction(key, text)
        self._applied_at[key] = index

    def _replaced(self, words: set[str], values: set[str], said: Sequence[Instruction]) -> None:
        """A stated turn changed what a standing condition or convention applied: the user's
        instructions that named it (two of its columns' words, its subject, a value) are what
        the change replaced, whatever words the new one uses ("abandoned" for the skip rate).
        Those this turn set stay."""
        now = {ins.key for ins in said}
        stems_of = {w if len(w) < 5 else w[:5] for w in words}
        for key in [k for k in self.items if not k.startswith(("sql:", KEY_PREFIX))]:
            if key in now:
                continue
            text = self.items[key].text
            subject = content_words(key.partition(":")[2])
            shared = len(stems_of & stems(text))
            if shared >= _NAMES_IT or words & subject or values & content_words(text):
                self.replaced.append(self.items.pop(key).text.casefold())

    def _retire(self, gone: set[str], keep: str) -> None:
        """Standing SELECT conventions that read a column a stated change took out."""
        for key in [k for k in self.items if k.startswith(SELECT_KEY) and k != keep]:
            if gone & identifiers(self.items[key].text):
                del self.items[key]

    def drop_unapplied(self) -> None:
        """Standing conditions the latest queries on their table stopped applying (left out,
        or with another value). When the user took a restriction back in this fold before
        those queries ("the 22:00-06:00 crew counts again"), the instruction the condition
        applied ("the night shift is out") goes too: the take-back named it differently, the
        queries show which one it lifted."""
        for key in [k for k in self.items if k.startswith("sql:")]:
            text = self.items[key].text
            start = self._applied_at.get(key, -1) + 1
            touching = [q for q in self._queries[start:] if holds(text, q) is not None]
            if len(touching) >= UNAPPLIED_QUERIES and not any(holds(text, q) for q in touching):
                del self.items[key]
                if any(lift >= start for lift in self._lifts):  # after its last use
                    self._drop_linked(condition_words(text), condition_values(text))


_SEEN_COUNT = re.compile(r"\s+\((\d+) quer(?:y|ies) in a row\)$")


def seen_line(text: str, count: int) -> str:
    """A condition not standing yet, with the queries in a row that applied it."""
    return f"{text} ({count} {'query' if count == 1 else 'queries'} in a row)"


def parse_seen(line: str) -> tuple[str, int]:
    """(condition text, queries in a row) of a `Query filters:` line; 1 when it does not say."""
    m = _SEEN_COUNT.search(line)
    if m is None:
        return line, 1
    return line[: m.start()], max(1, min(int(m.group(1)), SQL_STANDING_QUERIES - 1))
