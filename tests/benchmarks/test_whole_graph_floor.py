"""``benchmarks/whole_graph_floor.py``: a tiny run gives every way's row, with sync's
results (the script exits non-zero if a way differs)."""

from __future__ import annotations

import pytest
from benchmark_script import run_script


@pytest.mark.timeout(240)
def test_whole_graph_floor_tiny() -> None:
    proc = run_script("whole_graph_floor.py", ["--rounds", "3", "--pause", "0.01", "--quick"], 200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].split("|")[1:-1] == [
        " cell ",
        " sync ms ",
        " shoal ms ",
        " whole ms ",
        " shoal/sync ",
        " whole/sync ",
        " lane runs ",
        " graph runs ",
    ]
    cells = {row.split("|")[1].strip(): row.split("|")[2:-1] for row in rows[1:]}
    assert set(cells) == {"matmul", "array_sum"}
    for values in cells.values():
        sync, shoal, whole, shoal_ratio, whole_ratio, lane_runs, graph_runs = map(float, values)
        assert sync > 0 and shoal > 0 and whole > 0
        assert shoal_ratio == pytest.approx(shoal / sync, rel=0.05, abs=0.01)
        assert whole_ratio == pytest.approx(whole / sync, rel=0.05, abs=0.01)
        assert 0 <= lane_runs <= 3 and 0 <= graph_runs <= 3


def test_whole_graph_floor_rejects_an_unknown_cell() -> None:
    proc = run_script("whole_graph_floor.py", ["--only", "nope"], 60)
    assert proc.returncode == 2 and "unknown cell 'nope'" in proc.stderr
