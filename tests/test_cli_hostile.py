"""The command line under hostile input: every subcommand that reads or changes memory, with
arguments hypothesis draws, over threads whose stored text is drawn from a hostile alphabet.

Invariants after every example:
* the exit status is 0, 1 (a runtime error) or 2 (a usage error);
* a failure is exactly one line on stderr, `error: ...`; never a traceback;
* stdout holds no raw control character (C0 but newline and tab, DEL, C1), no bidi override
  or isolate, no line or paragraph separator: stored text is shown, never obeyed;
* a destructive command (threads delete, forget, retention run) changes nothing unless told
  `--yes` (there is no terminal to ask on).

Commands that start processes or run for minutes (worker, flower, demo, migrate, bench, eval,
`events tail --follow`) are the process generator's. The short run is deterministic; the long
run: `CLI_HOSTILE_EXAMPLES=2000 make test PYTEST_ARGS="tests/test_cli_hostile.py"`.
"""

from __future__ import annotations

import os
import re
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.main import get_command

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.cli import app, run
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs

pytestmark = pytest.mark.usefixtures("settings_agree")

SKIPPED = ("worker", "flower", "demo", "migrate", "bench", "eval")
NEVER = {"--follow", "-f"}  # blocks until interrupted
DESTRUCTIVE = (("threads", "delete"), ("forget",), ("retention", "run"))
# What a terminal would obey: ESC sequences (CSI cursor moves, OSC 52 clipboard writes, a
# title change), BEL, backspace, a C1 CSI, bidi overrides and isolates, separators.
HOSTILE = (
    "\x1b[2J\x1b[H",
    "\x1b]52;c;ZXZpbA==\x07",
    "\x1b]0;owned\x1b\\",
    "\x07\x08\x08\x08",
    "\x9b31m",
    "\u202egnp.exe",
    "\u2066isolated\u2069",
    "line\u2028sep",
    "\r\x01\x7f",
)
HOSTILE_TEXT = st.lists(st.sampled_from(HOSTILE) | st.text(max_size=8), min_size=1, max_size=4).map(
    "".join
)


@dataclass
class Seeded:
    owner: str
    thread_ids: list[str]


@pytest.fixture(scope="module")
def seeded() -> Iterator[Seeded]:
    """Two threads of one owner whose queries, answers, SQL and titles hold every HOSTILE
    sequence."""
    owner = f"hostile-{uuid.uuid4().hex[:6]}"
    memory = RedisConversationMemory()
    tids = []
    for t in range(2):
        tid = uuid.uuid4()
        for n in range(1, 4):
            text = "".join(HOSTILE[(t + n) % len(HOSTILE) :]) + "".join(HOSTILE)
            snap = make_snapshot(tid, n, owner_id=owner, user_query=f"q {text}", answer=f"a {text}")
            snap["sql"] = [f"SELECT '{text}' FROM sales"]
            assert save_session_to_thread_safe(snap, memory=memory).status == "saved"
        tids.append(str(tid))
    yield Seeded(owner, tids)


def _leaves() -> list[tuple[tuple[str, ...], Any]]:
    """Every leaf command under the app, with its path."""
    out: list[tuple[tuple[str, ...], Any]] = []

    def walk(path: tuple[str, ...], command: Any) -> None:
        subs = getattr(command, "commands", None)
        if subs is None or (path and getattr(command, "invoke_without_command", False)):
            out.append((path, command))  # `threads` lists on its own as well
        for name, sub in (subs or {}).items():
            walk((*path, name), sub)

    walk((), get_command(app))
    return [(p, c) for p, c in out if p and p[0] not in SKIPPED]


LEAVES = _leaves()


def _value(param: Any, seeded: Seeded) -> st.SearchStrategy[str]:
    name = str(param.bare_type()).lower()  # typer 0.29 vendors click: its own parameters
    edges = ["-1", "0", "1", "1e3", str(-(2**31) - 1), str(2**63)]  # the database's edges
    numbers = st.sampled_from(edges) | st.integers(-(2**70), 2**70).map(str)
    known = st.sampled_from([seeded.owner, *seeded.thread_ids, str(uuid.uuid4())])
    if "int" in name or "float" in name:
        return numbers | HOSTILE_TEXT
    return known | HOSTILE_TEXT | st.sampled_from(["", " ", "\u3000"])


@st.composite
def invocations(draw: st.DrawFn, seeded: Seeded) -> list[str]:
    path, command = draw(st.sampled_from(LEAVES))
    args = list(path)
    for param in command.params:
        opts = [o for o in param.opts if o not in NEVER]
        if param.param_type_name == "argument":
            if draw(st.integers(0, 9)):  # now and then left out: a usage error
                args.append(draw(_value(param, seeded)))
        elif opts and (param.required or draw(st.integers(0, 2))) and draw(st.integers(0, 9)):
            if param.is_flag:
                args.append(opts[0])
            else:
                args += [opts[0], draw(_value(param, seeded))]
    if draw(st.integers(0, 9)) == 0:
        args.append(draw(st.sampled_from(["--nope", "extra", "--limit"])))
    return args


def _unsafe(text: str) -> list[str]:
    """Characters a terminal would obey, by Unicode's categories (not the code's own list)."""
    return [
        c
        for c in text
        if (unicodedata.category(c) == "Cc" and c not in "\n\t")
        or unicodedata.bidirectional(c)
        in ("LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI")
        or unicodedata.category(c) in ("Zl", "Zp")
    ]


def _threads_of(seeded: Seeded) -> list[list[int]]:
    return [stored_seqs(uuid.UUID(t)) for t in seeded.thread_ids]


@settings(
    max_examples=int(os.environ.get("CLI_HOSTILE_EXAMPLES", "80")),
    deadline=None,
    derandomize="CLI_HOSTILE_EXAMPLES" not in os.environ,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_every_command_fails_in_one_line_and_prints_no_control_sequence(
    data: st.DataObject, seeded: Seeded, capsys: pytest.CaptureFixture[str]
) -> None:
    args = data.draw(invocations(seeded))
    before = _threads_of(seeded)
    capsys.readouterr()
    status = run(args)
    out, err = capsys.readouterr()
    assert status in (0, 1, 2), (args, status)
    assert "Traceback" not in out + err, args
    if status:
        lines = err.strip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, err)
    assert _unsafe(out) == [], (args, out[:300])
    if any(tuple(args[: len(d)]) == d for d in DESTRUCTIVE) and "--yes" not in args:
        assert _threads_of(seeded) == before, args


def test_a_stored_control_sequence_is_shown_escaped(
    seeded: Seeded, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    for args in (
        ["context", seeded.thread_ids[0], "--owner", seeded.owner],
        ["context", seeded.thread_ids[0], "--owner", seeded.owner, "--json"],
        ["context", seeded.thread_ids[0], "--owner", seeded.owner, "--focus", "sql"],
        ["threads", "--owner", seeded.owner],
    ):
        assert run(args) == 0, args
        out = capsys.readouterr().out
        assert _unsafe(out) == [], args
        assert "\\u001b]52;c;" in out or args[0] == "threads", args
        assert "\\u202e" in out, args


@pytest.mark.parametrize(
    "args",
    [
        ["context", "--max-tokens", "-1"],
        ["threads", "--limit", "-1"],
        ["events", "tail", "--count", "0"],
    ],
    ids=["context-max-tokens", "threads-limit", "events-count"],
)
def test_an_out_of_range_number_is_a_usage_error_in_one_line(
    args: list[str], seeded: Seeded, capsys: pytest.CaptureFixture[str]
) -> None:
    if args[0] == "context":
        args = [*args, seeded.thread_ids[0], "--owner", seeded.owner]
    if args[0] == "threads":
        args = [*args, "--owner", seeded.owner]
    capsys.readouterr()
    assert run(args) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"error: Invalid value for '--[a-z-]+': [^\n]+\n", err), err
