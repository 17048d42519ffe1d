"""`agent-memory bench redis-cluster`: both sides run, the figures and their ratio are
printed with the command, and the private cluster it started is stopped afterwards."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from memory_core.bench.redis_cluster_bench import bench_redis_cluster
from memory_core.devservices.redis_cluster import ClusterServer
from memory_core.devservices.system import alive
from memory_core.settings import get_settings


def test_the_bench_measures_both_sides_and_stops_its_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = bench_redis_cluster(
        settings=get_settings(), data_dir=tmp_path, threads=3, turns=2, reads=2
    )
    assert set(found) == {"single", "cluster"}
    assert all(saves > 0 and reads > 0 for saves, reads in found.values())
    out = capsys.readouterr().out
    assert out.startswith("agent-memory bench redis-cluster --threads 3 --turns 2 --reads 2")
    assert "cluster / single: saves " in out
    assert (tmp_path / "redis-cluster").is_dir()  # it started one there
    assert _nodes_under(tmp_path) == []  # and stopped it


def _nodes_under(root: Path) -> list[int]:
    """Pids of processes working in a directory under `root` (a node's `dir`)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and str(root) in str((proc / "cwd").resolve()):
                found.append(int(proc.name))
    return found


def test_a_running_cluster_is_used_and_left_running(
    redis_cluster: ClusterServer, tmp_path: Path
) -> None:
    """On the data dir of a cluster that runs (a developer's), the bench reuses it."""
    found = bench_redis_cluster(
        settings=get_settings(),
        data_dir=redis_cluster.root.parent,
        threads=2,
        turns=1,
        reads=1,
    )
    assert found["cluster"][0] > 0
    assert all(alive(redis_cluster.pid(p)) for p in redis_cluster.ports)
    assert len(_nodes_under(redis_cluster.root)) == 6  # what the first test finds none of
