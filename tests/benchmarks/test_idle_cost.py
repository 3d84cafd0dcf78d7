"""``benchmarks/idle_cost.py``: a tiny run prints every table, each pause once."""

from __future__ import annotations

import pytest
from benchmark_script import run_script


@pytest.mark.timeout(240)
def test_idle_cost_tiny() -> None:
    proc = run_script("idle_cost.py", ["--rounds", "3", "--pauses", "0.001,0.002"], timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables: list[list[list[str]]] = []
    for line in proc.stdout.splitlines():
        if not line.startswith("|"):
            if tables and tables[-1]:
                tables.append([])
            continue
        if not tables:
            tables.append([])
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set(cells[0]) != {"-"}:
            tables[-1].append(cells)
    tables = [t for t in tables if t]
    ping, gets, cpu = tables
    assert [row[0] for row in ping[1:]] == ["1", "2"]
    assert [row[0] for row in gets[1:]] == ["1", "2"]
    for row in gets[1:]:
        sync, shoal, ratio = map(float, row[1:])
        assert sync > 0 and shoal > 0
        # the ratio is of the unrounded medians; the times are printed to 3 decimals
        assert ratio == pytest.approx(shoal / sync, rel=0.01)
    assert cpu[0] == ["scheduler", "pause ms", "client", "scheduler", "worker 0", "worker 1"]
    assert {(row[0], row[1]) for row in cpu[1:]} == {
        ("sync", "1"),
        ("shoal", "1"),
        ("sync", "2"),
        ("shoal", "2"),
    }
