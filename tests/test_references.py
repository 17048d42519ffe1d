"""Every file reference in the repository resolves from where it stands.

A path-looking token (a name ending in .py, .md, .json, .yaml, .yml, .toml, .sh, .ini, .png,
.txt or .mako, optionally behind directories) must name a file or directory either relative
to the directory of the file that holds it or relative to the repository root. A rename
that leaves "see the old name" behind in a docstring or a doc then fails here, listing every
such reference as `file:line: ref`.

What is not a reference: URLs, globs (a `*` or braces in the name), dotted module names and
a name glued to more of itself (`script.py.mako`). In Python files only prose is read:
comments, docstrings and string literals holding whitespace (help texts, messages). A
literal without whitespace is a value joined to a path at run time, and code (attribute
access such as `response.json()`) is never read. Quoted values without whitespace in
configuration files (.toml, .yaml, .yml, .ini) are values for their tool, skipped likewise.

In a Markdown table, a row whose first cell names a folder (`memory_core/cli/`) lists that
folder's files by their bare names, as do the rows below it whose first cell is empty: a name
there resolves from that folder too.

Tokens that are deliberately not files of this repository are in ALLOWED, each with its
reason; an entry nothing refers to any more fails too, so the list cannot rot.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

from tests.support import REPO

EXTENSIONS = "py|md|json|yaml|yml|toml|sh|ini|png|txt|mako"
# Not preceded by a name, path, dot, glob or placeholder character; not followed by more name
# (`/`, `*`, `-`, `.x`) nor a call (`(`): the whole token or nothing.
PATTERN = re.compile(
    r"(?<![\w./*{}<>$%-])"
    rf"((?:(?:\.{{1,2}}|\.?[\w-]+)/)*\w[\w-]*\.(?:{EXTENSIONS}))"
    r"(?![\w/*(-]|\.\w)"
)
URL = re.compile(r"\w+://\S+")
BINARY = {".png"}
# In configuration, a quoted value without whitespace (a package-data name, an image tag) is
# a value for its tool, like a Python literal; comments and prose values are read.
CONFIG = {".toml", ".yaml", ".yml", ".ini"}
CONFIG_VALUE = re.compile(r"""(["'])[^"'\s]*\1""")

ALLOWED: dict[str, str] = {
    # Written at run time, not kept in the repository.
    "profile-save.txt": "a call tree `agent-memory bench profile --out DIR` writes",
    "profile-read.txt": "a call tree `agent-memory bench profile --out DIR` writes",
    "core-overview.png": "the overview figure `bench core --plots DIR` writes into DIR",
    "01-mine.yaml": "a conversation file a CLI test writes into its temporary folder",
    ".agent-memory/reliability/figures.json": "the figures the reliability suite merges (ignored)",
    # Examples of the shapes of text, not files.
    "file.py": "the `ClassName at file.py:123 (function)` format of an error's origin",
    "x.py": "an example error origin in a docstring",
    "keda.sh": "KEDA's web site (a domain), not a shell script",
    # Files of other projects.
    "flower/views/__init__.py": "Flower's source, where its management API lives",
    "pydantic/main.py": "a frame of pydantic in a quoted profile",
    "json/encoder.py": "a frame of the standard library in a quoted profile",
    "redis/connection.py": "a frame of redis-py in a quoted profile",
    "redis/client.py": "a frame of redis-py in a quoted profile",
    "redis/utils.py": "a frame of redis-py in a quoted profile",
    "redis/commands/core.py": "a frame of redis-py in a quoted profile",
    "redis/_parsers/hiredis.py": "a frame of redis-py in a quoted profile",
    "prometheus_client/metrics.py": "a frame of prometheus_client in a quoted profile",
    # History: the changelog names files that were removed.
    "tests/workers/harness.py": "removed; CHANGELOG.md records it",
    "tests/reliability/figures.py": "removed; CHANGELOG.md records it",
}


def _files() -> list[Path]:
    """Tracked files plus untracked ones git does not ignore, as they are on disk."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paths = (REPO / name for name in sorted(set(out.splitlines())))
    return [p for p in paths if p.is_file() and p.suffix not in BINARY]


def _python_prose(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment, docstring and whitespace-holding string literal."""
    previous = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
        elif tok.type == tokenize.STRING:
            statement = previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
            if statement or re.search(r"\s", tok.string):
                for offset, line in enumerate(tok.string.split("\n")):
                    yield tok.start[0] + offset, line
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok.type


def _prose(path: Path) -> Iterator[tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return
    if path.suffix == ".py":
        yield from _python_prose(text)
    elif path.suffix in CONFIG:
        for line_no, line in enumerate(text.split("\n"), 1):
            yield line_no, CONFIG_VALUE.sub("", line)
    else:
        yield from enumerate(text.split("\n"), 1)


TABLE_FOLDER = re.compile(r"^\|\s*`([\w./-]+/)`")


def _table_folders(path: Path) -> dict[int, str]:
    """Markdown only: the folder each table row speaks for. A row whose first cell names a
    folder (`memory_core/cli/`) speaks for it, and so do the rows below it with an empty
    first cell, until the table ends."""
    if path.suffix != ".md":
        return {}
    folders: dict[int, str] = {}
    current = ""
    for line_no, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.startswith("|"):
            current = ""
            continue
        if match := TABLE_FOLDER.match(line):
            current = match.group(1)
        elif not re.match(r"^\|\s*\|", line):
            current = ""  # a first cell that names no folder
        if current:
            folders[line_no] = current
    return folders


def _references() -> Iterator[tuple[str, int, str, str]]:
    """(file, line, ref, the folder its table row speaks for or "") of every path-looking
    token in the repository."""
    for path in _files():
        folders = _table_folders(path)
        for line_no, line in _prose(path):
            for match in PATTERN.finditer(URL.sub("", line)):
                rel = path.relative_to(REPO).as_posix()
                yield rel, line_no, match.group(1), folders.get(line_no, "")


def _resolves(file: str, ref: str, folder: str = "") -> bool:
    bases = [(REPO / file).parent, REPO] + ([REPO / folder] if folder else [])
    return any(base.joinpath(ref).exists() for base in bases)


def test_every_file_reference_resolves_from_where_it_stands() -> None:
    references = list(_references())
    unresolved = [
        f"{file}:{line}: {ref}"
        for file, line, ref, folder in references
        if ref not in ALLOWED and not _resolves(file, ref, folder)
    ]
    assert not unresolved, (
        "references that name no file, from the file's directory or the repository root "
        "(write the path from the root, or add a reasoned entry to ALLOWED):\n"
        + "\n".join(unresolved)
    )
    here = Path(__file__).relative_to(REPO).as_posix()  # its reasons name the entries
    unused = sorted(set(ALLOWED) - {ref for file, _, ref, _ in references if file != here})
    assert not unused, f"ALLOWED entries nothing refers to any more: {unused}"


def test_the_pattern_reads_references_and_skips_what_is_not_one() -> None:
    found = [m.group(1) for m in PATTERN.finditer(URL.sub("", SAMPLE))]
    assert found == ["memory_core/io/fast_write.py", "../docs/ARCHITECTURE.md", "pyproject.toml"]


SAMPLE = (
    "see memory_core/io/fast_write.py, ../docs/ARCHITECTURE.md and pyproject.toml; not "
    "https://example.org/x.md, tests/test_*.py, {a,b}.py, script.py.mako, core-<key>.png, "
    "memory_core.io.fast_write, f'{name}.json', response.json()"
)


def test_python_is_read_in_comments_docstrings_and_prose_strings_only() -> None:
    source = (
        '"""Doc README.md."""\n'
        'x = REPO / "CONTRIBUTING.md"  # CHANGELOG.md\n'
        'HELP = "writes docs/RELIABILITY.md"\n'
        "y = README.md\n"
    )
    refs = [m.group(1) for _, text in _python_prose(source) for m in PATTERN.finditer(text)]
    assert refs == ["README.md", "CHANGELOG.md", "docs/RELIABILITY.md"]
