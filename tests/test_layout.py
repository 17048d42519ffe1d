"""The house by subsystem (docs/ARCHITECTURE.md, "Layout"): a small top level, a folder per
subsystem whose `__init__` names what it holds, no import circle, files read in one sitting.

The import graph is read from the source with `ast`: every `import` counts, those inside
functions (lazy) and under `if TYPE_CHECKING:` included, since a circle there is still two
modules that cannot be understood apart.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

# Where the code lives, and the package name it has when installed (pyproject's package-dir).
ROOTS = {REPO / "memory_core": "memory_core", REPO / "workers": "memory_core.workers"}
SUBSYSTEMS = ("write", "copy", "fold", "instructions", "lifecycle", "io", "inspector")
MAX_TOP_MODULES = 12
MAX_LINES = 420  # "~400": one sitting


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for base, package in ROOTS.items():
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _installed(name: str) -> str:
    return "memory_core." + name if name == "workers" or name.startswith("workers.") else name


def _imported(module: str, path: Path) -> Iterator[str]:
    """The repository modules `module` imports, anywhere in its body."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = _installed(alias.name)
                while name and name not in MODULES:
                    name = name.rpartition(".")[0]
                if name:
                    yield name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = _installed(node.module or "")
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:
                    yield f"{source}.{alias.name}"
                elif source in MODULES:
                    yield source


def import_graph() -> dict[str, set[str]]:
    return {m: set(_imported(m, p)) - {m} for m, p in MODULES.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root, out in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(out)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next((w for w in edges if w not in index or w in on_stack), None)
            if nxt is not None and nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
                continue
            if nxt is not None:
                low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_in_the_library_or_the_workers() -> None:
    assert circles(import_graph()) == []


def test_the_graph_counts_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """memory_core/copy/settings_check.py once imported memory_core/conversation_memory.py
    under TYPE_CHECKING, which imports it back: a circle the graph must see."""
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from memory_core.conversation_memory import RedisConversationMemory\n"
        "def f():\n"
        "    from memory_core.fold import folding\n"
        "    from .views import render_conversation_context\n"
    )
    edges = set(_imported("memory_core.copy.m", source))
    assert edges == {
        "memory_core.conversation_memory",
        "memory_core.fold.folding",
        "memory_core.copy.views",
    }
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_top_of_the_library_is_its_public_face() -> None:
    top = sorted(p.name for p in (REPO / "memory_core").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


@pytest.mark.parametrize("package", SUBSYSTEMS)
def test_each_subsystem_folder_names_every_module_it_holds(package: str) -> None:
    """A reader goes to the folder first: its docstring is the map, and the map is current."""
    folder = REPO / "memory_core" / package
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    missing = [
        p.name
        for p in sorted(folder.glob("*.py"))
        if p.name != "__init__.py" and not re.search(rf"`{re.escape(p.name)}`", doc)
    ]
    assert missing == [], f"memory_core/{package}/__init__.py does not name {missing}"
    named = re.findall(r"`(\w+\.py)`", doc)
    assert [n for n in named if not (folder / n).exists()] == [], "it names modules it lacks"


def test_every_module_reads_in_one_sitting() -> None:
    long = {
        str(p.relative_to(REPO)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
