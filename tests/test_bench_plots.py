"""`agent-memory bench core --plots`: PNG plots of each figure's latency distribution.

The plot writer runs on synthetic pairs (the real bench needs Postgres and Redis and is slow;
tests/test_bench.py smoke-tests it). The CLI is checked through its help, the missing-matplotlib
path by hiding the package from the import system.
"""

from __future__ import annotations

import random
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from memory_core.bench.common import Pair
from memory_core.bench.plots import (
    INSTALL_HINT,
    new_figure,
    require_matplotlib,
    save_figure,
    write_latency_plots,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _samples(rng: random.Random, median_us: float, n: int, tail: float = 0.02) -> list[int]:
    """Log-normal ns samples around median_us, with a share of 10x outliers (a long tail)."""
    out = []
    for _ in range(n):
        v = median_us * 1000 * rng.lognormvariate(0, 0.25)
        out.append(int(v * 10 if rng.random() < tail else v))
    return out


def _pairs() -> list[Pair]:
    rng = random.Random(16)
    specs = [
        ("save", "sync save (50 warm threads)", "1 SQL + 1 EVALSHA", 1.5, 900, 700),
        ("get_context", "get_context hit", "plain GET", 2.0, 45, 30),
        ("render_warm", "render: warm", "1 x encode_ordinary", 0.5, 0.8, 2.0),
    ]
    pairs = [
        Pair(key, label, raw, goal, _samples(rng, core_us, 400), _samples(rng, raw_us, 400))
        for key, label, raw, goal, core_us, raw_us in specs
    ]
    # A figure under a microsecond, with a zero sample: the log axis must cope.
    pairs[-1].core[0] = 0
    return pairs


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, after checking the signature and its CRC."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16 : 16 + length]
    (crc,) = struct.unpack(">I", data[16 + length : 20 + length])
    assert zlib.crc32(kind + body) == crc
    assert data.endswith(b"IEND\xaeB`\x82"), "PNG is truncated"
    width, height = struct.unpack(">II", body[:8])
    return width, height


def test_one_valid_png_per_pair_named_by_key_plus_an_overview(tmp_path: Path) -> None:
    pairs = _pairs()
    out_dir = tmp_path / "nested" / "bench"  # created on demand
    written = write_latency_plots(pairs, out_dir, title_note="$ agent-memory bench core\ntoday")

    expected = [out_dir / f"core-{p.key}.png" for p in pairs] + [out_dir / "core-overview.png"]
    assert written == expected
    assert sorted(out_dir.iterdir()) == sorted(expected)
    for path in written:
        width, height = _png_size(path)
        assert width >= 800 and height >= 500, (path.name, width, height)
        # A drawn chart (axes, text, two distributions) is tens of kB; an empty canvas is ~5.
        assert path.stat().st_size > 20_000, (path.name, path.stat().st_size)
    # Each plot draws its own data: no two files are the same image.
    assert len({path.read_bytes() for path in written}) == len(written)


def test_bad_pairs_are_refused_before_any_file_is_written(tmp_path: Path) -> None:
    good = _pairs()[0]
    cases = {
        "no pairs": [],
        "has no samples": [Pair("empty", "l", "r", 1.0, [], [1000])],
        "not usable in a file name": [Pair("../evil", "l", "r", 1.0, [1000], [1000])],
        "duplicate pair keys": [good, good],
    }
    for message, pairs in cases.items():
        with pytest.raises(ValueError, match=message):
            write_latency_plots(pairs, tmp_path / "out", title_note="")
    assert not (tmp_path / "out").exists()


def test_save_figure_writes_a_png_and_creates_the_folder(tmp_path: Path) -> None:
    fig = new_figure(4, 3)
    fig.subplots().plot([1, 2, 3], [3, 1, 2])
    path = save_figure(fig, tmp_path / "x" / "y.png")
    assert path == tmp_path / "x" / "y.png"
    assert _png_size(path) == (440, 330)  # 4 x 3 in at 110 dpi


def test_missing_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes `import matplotlib` raise ImportError, as if not installed
    # (also when its submodules were imported earlier in this process).
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(RuntimeError, match="pip install 'agent-memory\\[bench\\]'") as err:
        write_latency_plots(_pairs(), tmp_path, title_note="")
    assert "matplotlib" in str(err.value) and INSTALL_HINT in str(err.value)
    with pytest.raises(RuntimeError, match="matplotlib"):
        require_matplotlib()
    assert list(tmp_path.iterdir()) == []


def test_bench_core_checks_matplotlib_before_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing extra fails at once, not after a long run: nothing is connected or printed."""
    from memory_core.bench.core import bench_core

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="agent-memory\\[bench\\]"):
        bench_core(
            database_url="postgresql://nobody@127.0.0.1:1/none",
            redis_url="redis://127.0.0.1:1/0",
            out=lines.append,
            plots_dir=Path("unused"),
        )
    assert lines == []


def _help() -> str:
    from memory_core.cli import app

    result = CliRunner().invoke(app, ["bench", "core", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_bench_core_help_lists_the_plot_options() -> None:
    text = _help()
    assert "--plots" in text and "DIR" in text and "--no-plots" in text
    assert "docs/bench" in text and "agent-memory[bench]" in text


def test_bench_core_refuses_plots_and_no_plots_together() -> None:
    from memory_core.cli import app

    result = CliRunner().invoke(app, ["bench", "core", "--plots", "out", "--no-plots"])
    assert result.exit_code == 1
    assert "--plots and --no-plots exclude each other" in result.output


@pytest.mark.parametrize(
    ("args", "make_docs_bench", "expected"),
    [
        ([], True, Path("docs/bench")),  # the default: docs/bench when it exists here
        ([], False, None),  # ... else no plots
        (["--plots", "elsewhere"], False, Path("elsewhere")),
        (["--plots", ""], True, None),  # empty disables
        (["--no-plots"], True, None),
    ],
)
def test_bench_core_plots_folder_resolution(
    args: list[str],
    make_docs_bench: bool,
    expected: Path | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import memory_core.bench.core
    from memory_core.cli import app

    seen: dict[str, object] = {}

    def fake_bench_core(**kwargs: object) -> dict[str, float]:
        seen.update(kwargs)
        return {}

    monkeypatch.setattr(memory_core.bench.core, "bench_core", fake_bench_core)
    monkeypatch.chdir(tmp_path)
    if make_docs_bench:
        (tmp_path / "docs" / "bench").mkdir(parents=True)
    result = CliRunner().invoke(app, ["bench", "core", "--iterations", "7", *args])
    assert result.exit_code == 0, result.output
    assert seen["iterations"] == 7 and seen["plots_dir"] == expected


def test_a_lower_bound_is_labelled_as_one_not_as_the_product_call() -> None:
    """A bound row (bench core's first-read floor) is not a figure of ours: its plot must not
    call its side the product call, in the legend, the ECDF labels or the verdict line."""
    from memory_core.bench.plots import _overview_figure, _pair_figure

    product = _pairs()[1]
    bound = Pair(
        "get_context_floor",
        "lower bound",
        product.raw_label,
        2.0,
        product.core,
        product.raw,
        bound=True,
    )

    def texts(fig: Any) -> str:
        found = [t.get_text() for t in fig.findobj(match=lambda o: hasattr(o, "get_text"))]
        return "\n".join(found)

    drawn = texts(_pair_figure(bound, "note"))
    assert "lower bound (not a product call)" in drawn
    assert "core (the product call)" not in drawn
    assert "bound p50" in drawn and "core p50" not in drawn
    assert "lower bound: ratio p50" in drawn
    assert "core (the product call)" in texts(_pair_figure(product, "note"))
    overview = texts(_overview_figure([product, bound], "note"))
    assert "bound p50" in overview and "core p50" in overview
