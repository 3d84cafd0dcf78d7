"""The shuffle benchmarks at a tiny size: they run, check results, and write a report.

``benchmarks/p2p_shuffle.py`` and ``benchmarks/adaptive_shuffle.py`` run as scripts in
a subprocess (they start clusters and install signal handlers of their own); the data
and event helpers they share are tested directly.
"""

from __future__ import annotations

import sys

import pandas as pd
import pytest
from benchmark_script import ROOT, run_script
from sizes import FULL

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import shuffle_data as sd  # noqa: E402
from benchmarks.shuffle_events import dask_restarts, p2p_totals, scale_counts  # noqa: E402

# ------------------------------------------------------------------ data and checks


def test_reference_agrees_with_pandas_and_catches_wrong_results():
    ref = sd.reference(2_000, seed=3, pandas_check=True)  # raises if pandas disagrees
    assert ref.merge.rows == ref.shuffle.rows == 2_000
    assert ref.merge.z_bits != 0 and ref.shuffle.z_bits == 0

    parts = [sd.make_events(b, sd.n_keys(2_000), 3) for b in sd.bounds(2_000)]
    frame = pd.concat(parts)
    # Partitioned on id: one partition per id residue; the sums add up to the reference.
    by_id = [frame[frame["id"] % 4 == r] for r in range(4)]
    got = sd.Summary.of(pd.concat([sd.summarize(p) for p in by_id]))
    assert got.mismatch(ref.shuffle) is None
    # The input partitions are not partitioned on id: an id in two partitions is caught.
    unshuffled = sd.Summary.of(pd.concat([sd.summarize(p) for p in parts]))
    assert "ids" in (unshuffled.mismatch(ref.shuffle) or "")
    # A lost row and a changed value are caught.
    lost = sd.Summary.of(pd.concat([sd.summarize(p) for p in [by_id[0].iloc[1:], *by_id[1:]]]))
    assert "rows" in (lost.mismatch(ref.shuffle) or "")
    changed = by_id[0].copy()
    changed.iloc[0, changed.columns.get_loc("x")] += 1e-9
    bad = sd.Summary.of(pd.concat([sd.summarize(p) for p in [changed, *by_id[1:]]]))
    assert "x_bits" in (bad.mismatch(ref.shuffle) or "")


def test_partitions_are_seeded_and_cover_every_row():
    assert sd.bounds(10) == [(0, 0, 2), (1, 2, 5), (2, 5, 7), (3, 7, 10)]
    with pytest.raises(ValueError, match="at least 4 rows"):
        sd.bounds(3)
    a = sd.make_events((2, 10, 20), 100, seed=1)
    pd.testing.assert_frame_equal(a, sd.make_events((2, 10, 20), 100, seed=1, tag="other"))
    assert not a.equals(sd.make_events((2, 10, 20), 100, seed=2))
    assert list(a.columns) == ["id", "name", "x", "y"] and a.index.name == "timestamp"


def test_event_readers():
    p2p = [
        (1.0, {"action": "p2p-start", "id": "a"}),
        (2.0, {"action": "restart", "why": "worker left"}),
        (3.0, {"action": "finish", "bytes_moved": 10, "bytes_spilled": 4}),
        (0.5, {"action": "finish", "bytes_moved": 99, "bytes_spilled": 99}),  # before `since`
    ]
    totals = p2p_totals(p2p, since=1.0)
    assert (totals["started"], totals["restarted"], totals["finished"]) == (1, 1, 1)
    assert (totals["moved"], totals["spilled"]) == (10, 4)
    assert dask_restarts([("WARNING", "Shuffle abc restarted due to stimulus 'x'")]) == 1
    assert dask_restarts([("WARNING", "Shuffle abc deactivated due to stimulus 'x'")]) == 0
    log = [(1.0, {"status": "up", "n": 3}), (2.0, {"status": "down", "workers": ["a"]})]
    assert scale_counts(log) == (1, 1)


# ------------------------------------------------------------------ the benchmarks


def table(report: str, section: str) -> list[list[str]]:
    """The cells of the body rows of the first table under ``## section``."""
    lines = report.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return [r for r in rows if len(r) > 1][2:]  # after the header and the |---| line


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


# One cluster per system for all three operations: a third of the cluster starts (the
# bulk of these runs); SHOAL_TEST_SIZE=full runs the benchmark's fresh cluster per operation.
ONE_CLUSTER = [] if FULL else ["--cluster-per", "system"]


@pytest.mark.timeout(150)
def test_p2p_shuffle_tiny(tmp_path):
    out = tmp_path / "p2p.md"
    args = ["--size", "20000", "--runs", "1", "--systems", "dask-p2p,shoal-p2p", *ONE_CLUSTER]
    res = run_script("p2p_shuffle.py", [*args, "--out", str(out)], 140)
    assert res.returncode == 0, res.stderr[-4000:]
    report = out.read_text()
    assert "load average" in report
    rows = table(report, "Results")
    # operation, metric, dask-p2p, shoal-p2p, ratio
    assert [(r[0], r[1]) for r in rows][:4] == [
        ("shuffle", "wall s"),
        ("shuffle", "peak RSS per worker MB"),
        ("shuffle", "peak over RSS before MB"),
        ("shuffle", "spilled MB"),
    ]
    assert number(rows[0][2]) > 0  # Dask's wall time
    for row in rows:
        assert number(row[2]) >= 0, row  # Dask P2P ran: a figure in every row
        # shoal P2P ran, or says cleanly that it is not there yet
        assert row[3] == "not available" or number(row[3]) >= 0, row
    if rows[0][3] != "not available":
        assert number(rows[0][3]) > 0
        assert "## Bar" in report and "not measured" not in report


@pytest.mark.timeout(150)
def test_p2p_shuffle_tiny_tasks(tmp_path):
    out = tmp_path / "p2p.md"
    args = ["--size", "20000", "--runs", "1", "--systems", "shoal-tasks", *ONE_CLUSTER]
    res = run_script("p2p_shuffle.py", [*args, "--out", str(out)], 140)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = table(out.read_text(), "Results")
    assert [r[2] for r in rows if r[1] == "spilled MB"] == ["—", "—"]  # not a P2P shuffle
    assert all(number(r[2]) >= 0 for r in rows if r[1] != "spilled MB"), rows
    assert number(rows[0][2]) > 0


@pytest.mark.timeout(150)
def test_adaptive_shuffle_tiny(tmp_path):
    out = tmp_path / "adaptive.md"
    args = ["--duration", "2", "--rows", "20000", "--gaps", "0.3", "--settle-timeout", "5"]
    res = run_script("adaptive_shuffle.py", [*args, "--out", str(out)], 140)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = {r[0]: r for r in table(out.read_text(), "Results")}
    # system, merges, wrong results, failed merges, ...
    dask = rows["dask"]
    assert int(dask[1]) >= 1 and dask[2] == "0" and dask[3] == "0", dask
    shoal = rows["shoal"]
    assert shoal[1] == "not available" or (shoal[2] == "0" and shoal[3] == "0"), shoal
