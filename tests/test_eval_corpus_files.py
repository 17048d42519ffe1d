"""The fidelity corpus as data files: the shipped files load, the schema is current, and a broken
file, however it is broken, is one `CorpusError` line naming the file and nothing loads.

The hostile generator mutates shipped files at random places (a key dropped, a key added, a
value replaced by any YAML value) and holds the loader to its promise: a mutated file either
loads into a conversation that builds into turns, or is refused in one line starting with its
name; never another exception, never a traceback.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_core.eval import SCENARIOS, corpus
from memory_core.eval.files import (
    CONVERSATIONS,
    CorpusError,
    load,
    load_file,
    parse,
    schema_text,
    to_scenario,
)
from memory_core.eval.filler import Script

FILES = sorted(CONVERSATIONS.glob("*.yaml"))
FIRST = FILES[0]
SCHEMA = "schema.json"  # beside the files, as each file's first line names it
SOURCE = FIRST.name  # the name errors carry


def _doc(path: Path = FIRST) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


class _NoAliases(yaml.SafeDumper):
    """A value the mutations share between two places is written twice (files have no aliases)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_NoAliases, sort_keys=False, allow_unicode=True)


def _refused(text: str, source: str = SOURCE) -> str:
    with pytest.raises(CorpusError) as info:
        parse(text, source)
    message = str(info.value)
    assert message.startswith(f"{source}:") and "\n" not in message, message
    return message


# ------------------------------------------------------------------------- the shipped files


def test_the_shipped_corpus_is_thirty_eight_files_in_their_numbers_order() -> None:
    assert len(FILES) == len(SCENARIOS) == 38
    assert [p.name.split("-", 1)[1].removesuffix(".yaml") for p in FILES] == [
        s.name for s in SCENARIOS
    ]
    assert [int(p.name.split("-")[0]) for p in FILES] == list(range(1, 39))


def test_schema_json_is_the_models_schema() -> None:
    """Regenerate with `agent-memory eval schema > memory_core/eval/conversations/schema.json`."""
    assert (CONVERSATIONS / SCHEMA).read_text() == schema_text()


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_shipped_file_is_valid_under_the_json_schema_too(path: Path) -> None:
    schema = json.loads((CONVERSATIONS / SCHEMA).read_text())
    jsonschema.Draft202012Validator(schema).validate(_doc(path))
    assert path.read_text().startswith(f"# yaml-language-server: $schema={SCHEMA}\n")


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_a_file_round_trips_through_its_model(path: Path) -> None:
    model = parse(path.read_text(), path.name)
    again = parse(_text(model.model_dump(exclude_defaults=True)), path.name)
    assert to_scenario(again) == to_scenario(model) == load_file(path)


def test_a_copied_folder_plays_the_same_corpus(tmp_path: Path) -> None:
    """`--conversations FOLDER` with the shipped files is the shipped corpus."""
    for path in FILES:
        shutil.copy(path, tmp_path / path.name)
    assert corpus(tmp_path) == corpus()


# --------------------------------------------------------------------------- broken files


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node: Any = out
    for part in parents:
        node = node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return out


_DELETE = object()
BROKEN = [
    ("round", _DELETE, "round: Field required"),
    ("holdot", True, "holdot: Extra inputs are not permitted"),
    ("domain.dims.0.values", [2024, 2025], "domain.dims[0].values[0]: Input should be a valid str"),
    ("says.0.at", "2", "says[0].at: Input should be a valid integer"),
    ("turns", 11, "turns: Input should be greater than or equal to 12"),
    ("holdout", "no", "holdout: Input should be a valid boolean"),
    ("says.0.probe", "(test", "says[0] (no-test-accounts).probe does not compile"),
    ("says.0.replaces", "nothing-set", "says[0] (no-test-accounts).replaces: no earlier"),
    ("says.0.at", 40, "turn 40 is in the last 10 turns"),
    ("says.1.fact", "no-test-accounts", "fact 'no-test-accounts' is set twice"),
    ("says.0.fact", "No Test", "says[0].fact: String should match pattern"),
    ("says.0.grain", "year", "says[0] (no-test-accounts).grain: 'year' is not one of"),
    ("says.0.effect", [["round", "-2"]], "rounding '-2' is not one of"),
    ("says.0.effect", [["where"]], "says[0].effect[0]: List should have at least 2 items"),
    ("says.0.uses", "nothing", "says[0] (no-test-accounts).uses: no metric reads $'nothing'"),
    ("domain.base", [["amount", "o.amount_usd"]], "domain.base sets no 'ts'"),
    ("domain.metrics.0.sql", "SUM($)", "metric 'revenue': 'SUM($)' is not a valid $template"),
    ("domain.dashboards", ["One"], "domain.dashboards: List should have at least 2 items"),
    ("domain.traps.0.sql", "SELECT 1", "domain.traps[0].sql: Input should be a valid list"),
    ("says", [], "says: List should have at least 1 item"),
]


@pytest.mark.parametrize(("where", "value", "expected"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_field_is_one_line_naming_file_and_field(
    where: str, value: Any, expected: str
) -> None:
    assert expected in _refused(_text(_set(_doc(), where, value)))


def test_a_replacement_must_come_after_what_it_replaces() -> None:
    doc = _doc()
    replacing = next(i for i, s in enumerate(doc["says"]) if s.get("replaces"))
    late = doc["says"][replacing]["at"]
    target = next(
        i for i, s in enumerate(doc["says"]) if s["fact"] == doc["says"][replacing]["replaces"]
    )
    message = _refused(_text(_set(doc, f"says.{target}.at", late)))
    assert "set at the same turn or later" in message or "no earlier instruction" in message


def test_a_metric_needing_state_nobody_sets_does_not_build() -> None:
    doc = _doc()
    # Every metric reads state no base sets: the first question has nothing to ask about.
    metrics = [m for m in doc["domain"]["metrics"] if "$repeat" in m["sql"]]
    metrics.append({"label": "ghost", "sql": "SUM($ghost)", "alias": "ghost"})
    assert "does not build into turns" in _refused(_text(_set(doc, "domain.metrics", metrics)))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: a\nname: b\n", f"{SOURCE}:2:1: duplicate key 'name'"),
        ("name: [unclosed\n", f"{SOURCE}:2:1:"),
        ("- just\n- a list\n", "expected a mapping of fields, got list"),
        ("", "expected a mapping of fields, got NoneType"),
        ("!!python/object:os.system {}\n", f"{SOURCE}:1:1:"),
        ("? [a, b]\n: c\n", "found unhashable key"),
        ("name: &a [*a]\n", f"{SOURCE}:1:11: aliases (*name) are not allowed"),
        ("a: &x [1, 1]\nb: &y [*x, *x]\n", f"{SOURCE}:2:8: aliases (*name) are not allowed"),
    ],
    ids=[
        "duplicate-key",
        "unclosed",
        "list",
        "empty",
        "python-tag",
        "unhashable",
        "alias-loop",
        "alias-bomb",
    ],
)
def test_text_that_is_not_a_conversation_is_one_line(text: str, expected: str) -> None:
    assert expected in _refused(text)


def test_a_file_name_must_be_its_number_and_name(tmp_path: Path) -> None:
    good = FIRST.read_text()
    (tmp_path / "1-nordic-shop.yaml").write_text(good)
    with pytest.raises(CorpusError, match=r"^1-nordic-shop\.yaml: a conversation file is named"):
        load(tmp_path)
    (tmp_path / "1-nordic-shop.yaml").rename(tmp_path / "01-nordic-store.yaml")
    with pytest.raises(CorpusError, match=r"name 'nordic-shop' differs from the file's name"):
        load(tmp_path)


def test_two_files_may_not_share_a_number_or_a_name(tmp_path: Path) -> None:
    shutil.copy(FIRST, tmp_path / FIRST.name)
    shutil.copy(FIRST, tmp_path / ("02-" + FIRST.name.split("-", 1)[1]))
    with pytest.raises(CorpusError, match="two files share 'nordic-shop'"):
        load(tmp_path)
    (tmp_path / ("02-" + FIRST.name.split("-", 1)[1])).unlink()
    shutil.copy(FILES[1], tmp_path / ("01-" + FILES[1].name.split("-", 1)[1]))
    with pytest.raises(CorpusError, match="two files share 1"):
        load(tmp_path)


def test_an_empty_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="no conversation files"):
        load(tmp_path)


# ----------------------------------------------------------------- the hostile generator

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=400),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(
        ["", "$", "$x", "(", "ts", "where", "round", "month", "-3", "no-test-accounts"]
    ),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths_values(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return [*node.keys(), *(v for x in node.values() for v in _paths_values(x))]
    if isinstance(node, list):
        return [v for x in node for v in _paths_values(x)]
    return [node]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    children = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, child in children:
        out += _paths(child, (*prefix, key))
    return out


_DOCS = [_doc(p) for p in FILES[::6]]  # five domains of different rounds
_STRINGS = sorted({v for d in _DOCS for v in _paths_values(d) if isinstance(v, str)})


def _alike(draw: st.DrawFn, old: Any) -> Any:
    """A value of the same kind as `old`: the mutations that pass the shapes, to reach the build."""
    if isinstance(old, bool):
        return draw(st.booleans())
    if isinstance(old, int):
        return draw(st.integers(min_value=0, max_value=150))
    if isinstance(old, str):
        return draw(st.text(min_size=1, max_size=30) | st.sampled_from(_STRINGS))
    if isinstance(old, list) and old:
        return draw(st.permutations(old))[: draw(st.integers(min_value=1, max_value=len(old)))]
    return old


@st.composite
def _mutated(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(st.sampled_from(_DOCS)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_paths(doc)))
        node: Any = doc
        for part in path[:-1]:
            node = node[part]
        action = draw(st.sampled_from(["alike", "alike", "replace", "delete", "add"]))
        if action == "delete" and isinstance(node, dict):
            del node[path[-1]]
        elif action == "add" and isinstance(node, dict):
            node[draw(st.text(min_size=1, max_size=8))] = draw(_VALUES)
        elif action == "add" and isinstance(node, list) and node:
            node.append(copy.deepcopy(draw(st.sampled_from(node))))
        elif action == "alike":
            node[path[-1]] = _alike(draw, node[path[-1]])
        else:
            node[path[-1]] = draw(_VALUES)
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_a_mutated_file_loads_and_builds_or_is_one_line(doc: dict[str, Any]) -> None:
    try:
        model = parse(_text(doc), "07-mutant.yaml")
    except CorpusError as exc:
        message = str(exc)
        assert message.startswith("07-mutant.yaml:") and "\n" not in message, message
        return
    conversation = Script(to_scenario(model)).build()
    assert len(conversation.turns) == model.turns
    assert {f.id for f in conversation.facts} == {s.fact for s in model.says}
