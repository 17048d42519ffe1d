"""Smoke tests of `agent-memory bench core|access|rss`: each runs end to end, reports every figure.

No timing assertions: the figures depend on the machine; docs/BENCHMARKS.md holds a real run.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path

from memory_core.bench.common import exchange, snapshot
from memory_core.bench.core import COMMAND, bench_core
from memory_core.bench.floor import materialize
from memory_core.bench.guest import bench_access, bench_rss
from memory_core.copy.context import ConversationContext
from memory_core.settings import get_settings
from memory_core.write.artifacts import DashboardArtifact, SqlArtifact, VisualizationArtifact

FIGURES = (
    "save",
    "get_context",
    "get_context_cold",
    "get_context_floor",
    "rehydrate",
    "render_warm",
    "render_cold",
)
MEASURES = ("p50_us", "p99_us", "raw_p50_us", "raw_p99_us", "ratio", "ratio_p99")


def test_bench_core_reports_every_figure_as_a_positive_number() -> None:
    settings = get_settings()
    lines: list[str] = []
    results = bench_core(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        iterations=30,
        out=lines.append,
    )
    expected = {f"{fig}.{m}" for fig in FIGURES for m in MEASURES}
    assert expected <= results.keys()
    for key, value in results.items():
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    assert lines[0] == f"$ {COMMAND}"
    verdicts = [line for line in lines if line.endswith(("| PASS |", "| MISS |"))]
    assert len(verdicts) == len(FIGURES) - 1
    bounds = [line for line in lines if line.endswith(("(PASS) |", "(MISS) |"))]
    assert len(bounds) == 1 and bounds[0].startswith("| lower bound: plain GET")


def test_the_floor_decodes_the_very_context_a_hit_returns() -> None:
    """The lower bound is only a bound if it decodes the same document into the same values:
    typed, they equal the context, every artifact kind and UUID / datetime field included."""
    import msgspec

    from memory_core.bench.floor import holds

    snap = {**snapshot(uuid.uuid4(), 7, "owner"), "sql": ["SELECT 1", "SELECT\n 2"]}
    turns = [exchange({**snap, "session_id": str(uuid.uuid4())}, n) for n in (1, 2)]
    ctx = ConversationContext(
        thread_id=uuid.uuid4(),
        summary="so far",
        summary_through_seq=3,
        recent=turns,
        missing_session_ids=[uuid.uuid4()],
    )
    doc = ctx.model_dump_json().encode()
    assert holds(doc, ctx)
    plain = materialize(doc)
    assert isinstance(plain, dict) and plain["recent"][0]["artifacts"][0]["kind"] == "sql"
    built = msgspec.convert(plain, ConversationContext)
    assert (
        {type(a) for a in built.recent[0].artifacts}
        == {type(a) for a in ctx.recent[0].artifacts}
        == {SqlArtifact, VisualizationArtifact, DashboardArtifact}
    )
    assert isinstance(built.recent[1].session_id, uuid.UUID)
    assert built.recent[1].completed_at == ctx.recent[1].completed_at
    assert not holds(doc, ConversationContext(thread_id=ctx.thread_id))


def test_bench_access_reports_both_copies_with_a_finite_ratio() -> None:
    lines: list[str] = []
    results = bench_access(settings=get_settings(), reps=5, out=lines.append)
    for copy in ("small", "large"):
        assert results[f"{copy}.stranger_ms"] > 0 and results[f"{copy}.unknown_ms"] > 0
        assert math.isfinite(results[f"{copy}.ratio"]) and results[f"{copy}.ratio"] >= 1
    assert lines[0] == "$ agent-memory bench access"
    assert sum(line.startswith(("| small", "| large")) for line in lines) == 2


def test_bench_rss_measures_a_fresh_process_at_100_and_n_turns() -> None:
    lines: list[str] = []
    results = bench_rss(settings=get_settings(), turns=120, out=lines.append)
    assert results["rss_100"] > 0 and results["rss_120"] > 0
    assert results["growth_mib"] == results["rss_120"] - results["rss_100"]
    assert lines[-1] == f"growth from 100 to 120 turns: {results['growth_mib']:+.1f} MiB"


def test_bench_profile_names_where_the_save_and_the_first_read_spend_time(
    tmp_path: Path,
) -> None:
    from memory_core.bench.profile import COMMAND as PROFILE
    from memory_core.bench.profile import bench_profile

    settings = get_settings()
    lines: list[str] = []
    bench_profile(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        calls=40,
        out_dir=tmp_path,
        out=lines.append,
    )
    assert lines[0] == f"$ {PROFILE} --calls 40"
    sections = [line for line in lines if line.startswith("### ")]
    assert [s.split(":")[0] for s in sections] == [
        "### sync save",
        "### first read (get_context, parsed anew)",
    ]
    shares = [line for line in lines if line.startswith("| ") and line.rstrip().endswith("|")]
    # The save's statement is named as the Postgres round trip, not as our code.
    assert any(line.startswith("| Postgres statement") for line in shares)
    # Frames name their file as a reader finds it (docs quote these tables: test_references).
    assert any("`execute_autocommit (memory_core/io/fast_write.py)`" in line for line in shares)
    assert (tmp_path / "profile-save.txt").read_text().strip()
    assert "get_context" in (tmp_path / "profile-read.txt").read_text()
