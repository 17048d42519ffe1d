"""The fidelity corpus as data: one YAML file per conversation, validated when it is loaded.

The files live in `conversations/` beside this module, named `NN-<name>.yaml`; the number gives
the corpus order (the tuning set by round, each shortest first, then the held-out set). The
format is the pydantic models below, strict (a number where text belongs is an error, not a
conversion) and closed (an unknown or misspelt key is an error, not ignored). Their JSON Schema
is `conversations/schema.json` (`agent-memory eval schema` prints it; a test keeps the file
current), for editors that check YAML against a schema. conversations/README.md says what
each field means and how the rounds were written.

Beyond the shapes, a file must hold together: probes compile, facts are unique, a replacement
names an instruction set before it, instructions sit before the distractor tail. A file that
does not gets one `CorpusError` line naming the file and the field, and nothing is loaded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from pathlib import Path
from string import Template
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from memory_core.cli.demo_script import Turn
from memory_core.eval.corpus import TAIL_TURNS, Choice, Dim, Domain, Metric, Say, Scenario
from memory_core.eval.filler import GRAINS, ROUNDING, Script

CONVERSATIONS = Path(__file__).with_name("conversations")
FILE_NAME = re.compile(r"(?P<number>\d{2,})-(?P<name>[a-z0-9]+(-[a-z0-9]+)*)\.yaml")
NEEDED_STATE = ("ts", "amount")  # every query's SQL reads them (filler.render_sql)

Text = Annotated[str, Field(min_length=1)]
Pair = Annotated[list[str], Field(min_length=2, max_length=2)]  # [state key, value]


class CorpusError(ValueError):
    """A conversation file that cannot be loaded: one line, the file first."""

    def __init__(self, message: str) -> None:
        # One line whatever the file holds: a key or value quoted in the message may carry a
        # newline or a control character; they show escaped.
        super().__init__("".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message))


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TrapTurn(_Model):
    """A turn using an instruction's words without setting one (the probes must not match)."""

    query: Text
    answer: Text
    sql: list[Text] = []


class SayModel(_Model):
    fact: Annotated[str, Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")]
    at: Annotated[int, Field(ge=1)]
    query: Text
    answer: Text
    probe: Text
    effect: list[Pair] = []
    replaces: str | None = None
    uses: str | None = None
    grain: str | None = None


class MetricModel(_Model):
    label: Text
    sql: Text
    alias: Text


class DimModel(_Model):
    label: Text
    plural: Text
    column: Text
    values: Annotated[list[Text], Field(min_length=2)]


class ChoiceModel(_Model):
    """A filter the user picks anew per question (`domain.choices`)."""

    label: Text
    column: Text
    values: Annotated[list[Text], Field(min_length=2)]


class DomainModel(_Model):
    tables: Text
    base: list[Pair]
    dims: Annotated[list[DimModel], Field(min_length=1)]
    metrics: Annotated[list[MetricModel], Field(min_length=1)]
    dashboards: Annotated[list[Text], Field(min_length=2, max_length=2)]
    table: Text
    traps: list[TrapTurn] = []
    choices: list[ChoiceModel] = []


class ScenarioModel(_Model):
    """One conversation: a domain, and the standing instructions the user gives in it."""

    name: Text
    round: Annotated[int, Field(ge=1)]  # the round of writing (README.md)
    holdout: bool
    turns: Annotated[int, Field(ge=TAIL_TURNS + 2)]
    domain: DomainModel
    says: Annotated[list[SayModel], Field(min_length=1)]

    @model_validator(mode="after")
    def _holds_together(self) -> ScenarioModel:
        base = {k for k, _ in self.domain.base}
        if missing := [k for k in NEEDED_STATE if k not in base]:
            raise ValueError(f"domain.base sets no {missing[0]!r}")
        for m in self.domain.metrics:
            for template in (m.sql, m.alias):
                if not Template(template).is_valid():
                    raise ValueError(f"metric {m.label!r}: {template!r} is not a valid $template")
        set_at: dict[str, int] = {}
        for i, say in enumerate(self.says):
            _check_say(self, i, say, set_at)
            set_at[say.fact] = say.at
        return self


def _check_say(sc: ScenarioModel, i: int, say: SayModel, set_at: dict[str, int]) -> None:
    where = f"says[{i}] ({say.fact})"
    try:
        re.compile(say.probe)
    except re.error as exc:
        raise ValueError(f"{where}.probe does not compile: {exc}") from None
    if say.fact in set_at:
        raise ValueError(f"{where}: fact {say.fact!r} is set twice")
    if say.at > sc.turns - TAIL_TURNS:
        raise ValueError(
            f"{where}.at: turn {say.at} is in the last {TAIL_TURNS} turns (the distractor tail)"
        )
    if say.replaces is not None and say.replaces not in set_at:
        raise ValueError(f"{where}.replaces: no earlier instruction {say.replaces!r}")
    if say.replaces is not None and set_at[say.replaces] >= say.at:
        raise ValueError(f"{where}.replaces {say.replaces!r}, set at the same turn or later")
    if say.grain is not None and say.grain not in GRAINS:
        raise ValueError(f"{where}.grain: {say.grain!r} is not one of {sorted(set(GRAINS))}")
    rounding = [v for k, v in say.effect if k == "round"]
    if bad := [v for v in rounding if v not in ROUNDING]:
        raise ValueError(f"{where}.effect: rounding {bad[0]!r} is not one of {sorted(ROUNDING)}")
    if say.uses is not None and not any(say.uses in m.needs() for m in _metrics(sc)):
        raise ValueError(f"{where}.uses: no metric reads ${say.uses!r}")


def _metrics(sc: ScenarioModel) -> list[Metric]:
    return [Metric(m.label, m.sql, m.alias) for m in sc.domain.metrics]


def _pairs(pairs: list[list[str]]) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in pairs)


def to_scenario(m: ScenarioModel) -> Scenario:
    """The validated file as the corpus's frozen dataclasses."""
    d = m.domain
    domain = Domain(
        tables=d.tables,
        base=_pairs(d.base),
        dims=tuple(Dim(x.label, x.plural, x.column, tuple(x.values)) for x in d.dims),
        metrics=tuple(_metrics(m)),
        dashboards=(d.dashboards[0], d.dashboards[1]),
        table=d.table,
        traps=tuple(Turn(t.query, t.answer, list(t.sql)) for t in d.traps),
        choices=tuple(Choice(c.label, c.column, tuple(c.values)) for c in d.choices),
    )
    says = tuple(
        Say(
            fact=s.fact,
            at=s.at,
            query=s.query,
            answer=s.answer,
            probe=s.probe,
            effect=_pairs(s.effect),
            replaces=s.replaces,
            uses=s.uses,
            grain=s.grain,
        )
        for s in m.says
    )
    return Scenario(m.name, m.turns, domain, says, holdout=m.holdout, round=m.round)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader, but a key given twice in one mapping is an error (PyYAML keeps the last),
    and so is an alias: a file of a few lines could otherwise expand into millions of values
    for the validation to walk (a "billion laughs"), and a conversation needs none."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.MarkedYAMLError(problem="aliases (*name) are not allowed", problem_mark=mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                break  # SafeLoader refuses an unhashable key itself, with its mark
            if key in seen:
                mark = key_node.start_mark
                raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}", problem_mark=mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int) or not re.fullmatch(r"[A-Za-z_][\w-]*", part):
            out += f"[{part!r}]" if isinstance(part, str) else f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def parse(text: str, source: str) -> ScenarioModel:
    """One file's text, validated; `source` names it in errors."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise CorpusError(f"{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise CorpusError(f"{source}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CorpusError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        model = ScenarioModel.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        msg = str(first["msg"]).removeprefix("Value error, ")
        where = f"{_location(first['loc'])}: " if first["loc"] else ""  # a whole-file check
        raise CorpusError(f"{source}: {where}{msg}{more}") from None
    try:  # the last check is the real one: the turns build (a metric for every question...)
        Script(to_scenario(model)).build()
    except (KeyError, IndexError, StopIteration, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise CorpusError(f"{source}: the conversation does not build into turns ({why})") from None
    return model


def load_file(path: Path) -> Scenario:
    """One conversation file: its name must be `NN-<name>.yaml`, `name` as in the file."""
    _, name = _file_name(path)
    model = parse(path.read_text(encoding="utf-8"), path.name)
    if model.name != name:
        raise CorpusError(f"{path.name}: name {model.name!r} differs from the file's name")
    return to_scenario(model)


def load(folder: Path = CONVERSATIONS) -> tuple[Scenario, ...]:
    """Every conversation under `folder`, in the order of the files' numbers."""
    paths = list(folder.glob("*.yaml"))
    if not paths:
        raise CorpusError(f"{folder}: no conversation files (NN-<name>.yaml)")
    named = sorted((_file_name(p), p) for p in paths)
    seen: dict[int | str, str] = {}
    for (number, name), path in named:
        for key in (number, name):
            if key in seen:
                raise CorpusError(f"{seen[key]}, {path.name}: two files share {key!r}")
            seen[key] = path.name
    return tuple(load_file(p) for _, p in named)


def _file_name(path: Path) -> tuple[int, str]:
    match = FILE_NAME.fullmatch(path.name)
    if match is None:
        raise CorpusError(f"{path.name}: a conversation file is named NN-<name>.yaml")
    return int(match["number"]), match["name"]


def json_schema() -> dict[str, Any]:
    """The files' JSON Schema (conversations/schema.json)."""
    schema = ScenarioModel.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "agent-memory fidelity conversation"
    return schema


def schema_text() -> str:
    """conversations/schema.json as it must read (`agent-memory eval schema` prints it)."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
