"""benchmarks/packing_ab.py at a tiny size: packing on and off on one cluster, a table."""

from __future__ import annotations

import pytest
from benchmark_script import run_script


def test_packing_ab_tiny():
    cells = ["array_sum", "delayed_sum"]
    res = run_script("packing_ab.py", ["--repeat", "2", "--quick", "--only", ",".join(cells)], 140)
    assert res.returncode == 0, res.stderr[-4000:]
    lines = [line for line in res.stdout.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["cell", "sync ms", "packed ms", "spread ms", "packed/sync", "spread/sync"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
    assert [r[0] for r in rows] == cells
    for row in rows:
        sync, packed, spread, packed_ratio, spread_ratio = map(float, row[1:])
        assert 0 < sync < 10_000 and 0 < packed < 10_000 and 0 < spread < 10_000, row
        assert packed_ratio == pytest.approx(packed / sync, rel=0.05, abs=0.01)
        assert spread_ratio == pytest.approx(spread / sync, rel=0.05, abs=0.01)


def test_packing_ab_rejects_an_unknown_cell():
    res = run_script("packing_ab.py", ["--only", "nope"], 60)
    assert res.returncode == 2 and "unknown cell 'nope'" in res.stderr
