"""The reliability figures file under xdist: workers record at once, none loses another's."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from tests.support import figures

WRITERS, EACH = 6, 25


def _write(path: Path, writer: int) -> None:
    for n in range(EACH):
        figures._merge({"id": f"crash.w{writer}.{n}", "lost": 0}, path)


def test_concurrent_records_keep_every_figure(tmp_path: Path) -> None:
    path = tmp_path / "figures.json"
    # spawn, not fork: a fork copies the xdist worker's threads' held locks (a CI run's forked
    # writer hung 60 s on one); fresh interpreters hold none, and still race on the file lock.
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write, args=(path, w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    data = figures.load(path)
    assert sorted(data) == sorted(f"crash.w{w}.{n}" for w in range(WRITERS) for n in range(EACH))


def test_render_orders_scenarios_by_group_then_id() -> None:
    row = {"scenario": "s", "jobs": 1, "faults": "f", "lost": 0, "duplicated": 0, "recover": "r"}
    data = {k: {"id": k, **row} for k in ("access.b", "crash.z", "outage.a", "misc.q", "crash.a")}
    ids = [line.split(" | ")[0].removeprefix("| ") for line in figures.render(data).splitlines()]
    assert ids[2:] == ["crash.a", "crash.z", "outage.a", "access.b", "misc.q"]
