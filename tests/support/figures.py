"""Figures of the reliability suite: recorded by the tests, rendered as the docs table.

Every scenario calls `record(...)`, which prints one parseable line

    RELIABILITY {"id": "crash.children", "scenario": "...", "jobs": 2000, "lost": 0, ...}

and merges the same object into `.agent-memory/reliability/figures.json` (keyed by `id`).
`python -m tests.support.figures` renders that file as the Markdown table of
docs/RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support import REPO

FIGURES_PATH = REPO / ".agent-memory" / "reliability" / "figures.json"
# One test at a time (no xdist): the figures are the system's, not the neighbours'; and -s
# prints the lines, which xdist's workers would swallow.
COMMAND = 'TEST_WORKERS=0 make test PYTEST_ARGS="tests/reliability -s"'
COLUMNS = ("scenario", "jobs", "faults", "lost", "duplicated", "recover", "checked")


def record(
    id: str,
    *,
    scenario: str,
    jobs: int,
    faults: str,
    lost: int,
    duplicated: int,
    recover_s: float | None = None,
    recover: str | None = None,
    checked: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """Print the scenario's figures as one `RELIABILITY {json}` line and store them."""
    figures: dict[str, Any] = {
        "id": id,
        "scenario": scenario,
        "jobs": jobs,
        "faults": faults,
        "lost": lost,
        "duplicated": duplicated,
        "recover_s": None if recover_s is None else round(recover_s, 2),
        "recover": recover if recover is not None else _seconds(recover_s),
        "checked": checked,
        **extra,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": COMMAND,
    }
    print("RELIABILITY " + json.dumps(figures, sort_keys=False), flush=True)
    _merge(figures)
    return figures


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def _merge(figures: dict[str, Any], path: Path = FIGURES_PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # xdist's workers record at once: a read-modify-write without the lock loses a figure.
    with (path.parent / ".figures.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load(path)
        data[figures["id"]] = figures
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".figures-")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
        os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file


def load(path: Path = FIGURES_PATH) -> dict[str, dict[str, Any]]:
    with contextlib.suppress(FileNotFoundError, ValueError):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return data
    return {}


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(data: dict[str, dict[str, Any]]) -> str:
    """The Markdown table, scenarios in suite order (their ids sort that way)."""
    header = "| # | scenario | jobs / ops | faults injected | lost | duplicated | time to recover |"
    lines = [header, "|---|---|---|---|---|---|---|"]
    for key in sorted(data, key=_order):
        f = data[key]
        lines.append(
            "| "
            + " | ".join(
                _cell(v)
                for v in (
                    f["id"],
                    f["scenario"],
                    f["jobs"],
                    f["faults"],
                    f["lost"],
                    f["duplicated"],
                    f["recover"],
                )
            )
            + " |"
        )
    return "\n".join(lines)


def render_checks(data: dict[str, dict[str, Any]]) -> str:
    return "\n".join(
        f"- **{data[k]['id']}**: {data[k]['checked']}"
        for k in sorted(data, key=_order)
        if data[k].get("checked")
    )


_GROUPS = ("crash", "outage", "concurrency", "input", "access")


def _order(key: str) -> tuple[int, str]:
    group = key.split(".", 1)[0]
    return (_GROUPS.index(group) if group in _GROUPS else len(_GROUPS), key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.figures")
    parser.add_argument("--json", type=Path, default=FIGURES_PATH, help="figures file")
    parser.add_argument("--checks", action="store_true", help="also list what each checked")
    args = parser.parse_args(argv)
    data = load(args.json)
    if not data:
        print(f"no figures in {args.json}: run {COMMAND}", file=sys.stderr)
        return 1
    print(render(data))
    if args.checks:
        print()
        print(render_checks(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
