"""The interactive benchmark at a tiny size: three systems, two cheap cells, a report.

``benchmarks/interactive.py`` runs as a script in a subprocess (it starts clusters and
installs signal handlers of its own); its result check and report helpers are tested
directly.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
from benchmark_script import ROOT, run_script

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.interactive import CELLS, Cell, bar, make_data, mismatch  # noqa: E402


def table(report: str, section: str) -> tuple[list[str], list[list[str]]]:
    """(header, body rows) of the first table under ``## section``."""
    lines = report.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    rows = [r for r in rows if len(r) > 1]
    return rows[0], rows[2:]  # the |---| line after the header


# ------------------------------------------------------------------ result check


def test_mismatch_accepts_equal_results_and_names_every_difference():
    frame = pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]})
    assert mismatch(frame, frame.copy()) is None
    assert mismatch(frame.b, frame.b.copy()) is None
    assert mismatch(np.float64(0.1 + 0.2), np.float64(0.1 + 0.2)) is None
    assert mismatch(np.array([1.0, np.nan]), np.array([1.0, np.nan])) is None
    assert mismatch(6, 6) is None
    # A last-bit difference (summation order) is the same result...
    ulp = frame.copy()
    ulp.loc[1, "b"] = np.nextafter(1.5, 2.0)
    assert mismatch(ulp, frame) is None
    assert mismatch(np.nextafter(np.float64(3.0), 4.0), np.float64(3.0)) is None
    # ...one row's worth in a million is not.
    changed = frame.copy()
    changed.loc[1, "b"] *= 1 + 1e-6
    assert "b" in (mismatch(changed, frame) or "")
    assert "1.0000" in (mismatch(np.float64(1.000001), np.float64(1.0)) or "")
    ints = frame.copy()
    ints.loc[1, "a"] = 3
    assert "a" in (mismatch(ints, frame) or "")
    assert "index" in (mismatch(frame.b.set_axis([5, 6]), frame.b) or "").lower()
    assert "expected a DataFrame" in (mismatch(frame.b, frame) or "")
    assert "float32" in (mismatch(np.float32(1.0), np.float64(1.0)) or "")
    assert "1 positions" in (mismatch(np.array([1.0, 2.0]), np.array([1.0, 2.01])) or "")
    assert "1 positions" in (mismatch(np.array([1, 2]), np.array([1, 3])) or "")
    assert "(3,)" in (mismatch(np.ones(3), np.ones(2)) or "")
    assert mismatch(7, 6) == "7, expected 6"


def test_bar_and_percentiles():
    assert bar(10.0, 15.0, 30.0) == "met"
    assert bar(10.0, 15.1, 40.0) == "MISSED (shoal/sync > 1.5)"
    assert bar(10.0, 12.0, 23.9) == "MISSED (dask/shoal < 2)"
    assert bar(10.0, None, 30.0) == "—"
    cell = Cell("shoal", "sum", seconds=[i / 1000 for i in range(1, 11)])  # 1..10 ms
    assert cell.median_ms == pytest.approx(5.5)
    assert cell.p90_ms == pytest.approx(9.0)


def test_every_cell_builds_a_collection_at_a_tiny_size():
    data = make_data(1_000, 500)
    for spec in CELLS.values():
        assert hasattr(spec.build(data), "__dask_graph__"), spec.name


# ------------------------------------------------------------------ the benchmark


@pytest.mark.timeout(150)
def test_interactive_tiny(tmp_path):
    out = tmp_path / "interactive.md"
    cells = ["delayed_sum", "array_sum"]
    args = ["--repeat", "2", "--only", ",".join(cells), "--quick", "--out", str(out)]
    res = run_script("interactive.py", args, 140)
    assert res.returncode == 0, res.stderr[-4000:]
    report = out.read_text()
    assert "load average" in report and "command: `python benchmarks/interactive.py" in report
    header, rows = table(report, "Results")
    assert header == [
        "cell", "tasks", "sync ms", "sync p90", "shoal ms", "shoal p90", "dask ms", "dask p90",
        "shoal/sync", "dask/shoal", "bar", "results",
    ]  # fmt: skip
    assert [r[0] for r in rows] == cells
    for row in rows:
        got = dict(zip(header, row, strict=True))
        assert got["results"] == "equal", row  # every system's result matched sync's
        assert int(got["tasks"]) >= 1
        medians = {s: float(got[f"{s} ms"]) for s in ("sync", "shoal", "dask")}
        for s, ms in medians.items():
            assert 0 < ms < 10_000, row
            assert float(got[f"{s} p90"]) >= ms, row  # p90 of the same runs
        assert float(got["shoal/sync"]) == pytest.approx(
            medians["shoal"] / medians["sync"], rel=0.05, abs=0.01
        )
        assert float(got["dask/shoal"]) == pytest.approx(
            medians["dask"] / medians["shoal"], rel=0.05, abs=0.01
        )
        assert got["bar"] == "met" or got["bar"].startswith("MISSED ("), row
    assert "Bar met in" in report and "## Failures" not in report
    cell_header, cell_rows = table(report, "Cells")
    assert cell_header == ["cell", "code", "tasks", "dask graph ms"]
    assert [r[0] for r in cell_rows] == cells
    for name, row in zip(cells, cell_rows, strict=True):
        assert row[2] == dict(zip(header, rows[cells.index(name)], strict=True))["tasks"]
        assert 0 < float(row[3]) < 10_000, row
    lane_header, lane_rows = table(report, "Lanes")
    assert lane_header == ["cell", "by lane"] and [r[0] for r in lane_rows] == cells
    for row in lane_rows:
        by_lane, of, timed = row[1].split(" ")
        assert of == "of" and timed == "2" and 0 <= int(by_lane) <= 2, row
