"""The fidelity corpus: what a scenario is made of, and how it becomes turns and facts.

A scenario is data (a file of memory_core/eval/conversations/, loaded by files.py): a domain
(tables, dimensions, metrics, trap questions) and the standing instructions the user gives at
fixed turns, some replacing earlier ones. `build` turns it into the turns an analytics agent
hands over at finalize (the question, the answer, the SQL it ran under the instructions in
force at that turn, charts and dashboards) and the facts the eval scores. The filler turns
between instructions come from a generator seeded with the scenario's name (filler.py): the
same corpus on every run and machine.

A held-out scenario (`holdout=True`, rounds 4 and 5) was written without looking at the instruction
detector and is never tuned against: its figures are reported on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Literal

from memory_core.cli.demo_script import Turn

TAIL_TURNS = 10  # the last turns: distractors that restate no instruction


@dataclass(frozen=True)
class Say:
    """A turn where the user sets a standing instruction (or replaces an earlier one).

    Several Says at the same turn are one message: their queries (and answers) joined in order.
    """

    fact: str
    at: int  # 1-based turn
    query: str
    answer: str
    probe: str  # case-insensitive regex: the instruction's content, in words or applied SQL
    effect: tuple[tuple[str, str], ...] = ()  # SQL state it sets; ("where", x) adds a filter
    replaces: str | None = None
    uses: str | None = None  # the turn's SQL shows a metric that uses this state key
    grain: str | None = None  # ... at this grain (default: that of the last question)


@dataclass(frozen=True)
class Metric:
    label: str  # how the user names it
    sql: str  # Template over the state ($money, $amount, $ts, definitions ...)
    alias: str  # Template too

    def needs(self) -> set[str]:
        ids = Template(self.sql).get_identifiers() + Template(self.alias).get_identifiers()
        return set(ids) - {"money", "ts"}


@dataclass(frozen=True)
class Dim:
    label: str
    plural: str
    column: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Choice:
    """A per-question choice: a filter the user picks anew in each question that names it
    ("What about Laptops in Q3?"). Never a standing instruction, whatever recurs."""

    label: str
    column: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Domain:
    tables: str  # the FROM clause
    base: tuple[tuple[str, str], ...]  # initial state: ts, amount, alias, where, ...
    dims: tuple[Dim, ...]
    metrics: tuple[Metric, ...]
    dashboards: tuple[str, str]
    table: str  # a table the last turns ask about
    traps: tuple[Turn, ...]  # similar words, no instruction
    choices: tuple[Choice, ...] = ()  # per-question filters (with a quarter and a top N)


@dataclass(frozen=True)
class Scenario:
    name: str
    turns: int
    domain: Domain
    says: tuple[Say, ...]
    holdout: bool = False  # written blind to the detector; never tuned against
    round: int = 1  # the round of writing (conversations/README.md)


@dataclass(frozen=True)
class Fact:
    id: str
    kind: Literal["established", "superseded"]
    set_turn: int
    probe: str
    superseded_turn: int | None = None


@dataclass(frozen=True)
class Conversation:
    name: str
    turns: tuple[Turn, ...]
    facts: tuple[Fact, ...]
    holdout: bool = False
    round: int = 1
    # (id, probe) of each per-question choice the conversation made: none may read as standing
    per_question: tuple[tuple[str, str], ...] = ()

    @property
    def established(self) -> list[Fact]:
        return [f for f in self.facts if f.kind == "established"]

    @property
    def superseded(self) -> list[Fact]:
        return [f for f in self.facts if f.kind == "superseded"]


def active_says(says: tuple[Say, ...], turn: int) -> list[Say]:
    """The instructions in force at `turn` (set at or before it, not replaced by then)."""
    replaced = {s.replaces: s.at for s in says if s.replaces}
    live = [s for s in says if s.at <= turn and replaced.get(s.fact, turn + 1) > turn]
    return sorted(live, key=lambda s: s.at)


def state_at(domain: Domain, says: tuple[Say, ...], turn: int) -> tuple[dict[str, str], list[str]]:
    """(state, WHERE filters) the agent's SQL follows at `turn`."""
    state: dict[str, str] = {}
    where: list[str] = []
    for key, value in domain.base + tuple(e for s in active_says(says, turn) for e in s.effect):
        if key == "where":
            where.append(value)
        else:
            state[key] = value
    return state, where


def facts_of(says: tuple[Say, ...]) -> tuple[Fact, ...]:
    by_replaced = {s.replaces: s.at for s in says if s.replaces}
    return tuple(
        Fact(
            id=s.fact,
            kind="superseded" if s.fact in by_replaced else "established",
            set_turn=s.at,
            probe=s.probe,
            superseded_turn=by_replaced.get(s.fact),
        )
        for s in sorted(says, key=lambda s: s.at)
    )


def turn_text(turn: Turn) -> str:
    """Everything a turn says: question, answer and SQL."""
    return "\n".join([turn.user_query, turn.answer, *turn.sql])
