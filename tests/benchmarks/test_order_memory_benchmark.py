"""``benchmarks/order_memory.py`` at a tiny size: the report's tables and sane values."""

from __future__ import annotations

from benchmark_script import run_script


def test_order_memory_report_at_a_tiny_size():
    proc = run_script("order_memory.py", ["--large", "2k", "--skip-dask-tests"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["graph", "tasks", "dask peak", "cheap peak", "dask µs/task", "cheap µs/task"]
    rows = [
        dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[1:]
    ]
    assert len(rows) == 4
    for row in rows:
        tasks = int(row["tasks"].replace(",", ""))
        assert 100 < tasks < 10_000
        for column in ("dask peak", "cheap peak"):
            assert 0 < int(row[column].replace(",", "")) <= tasks
    scale = rows[0]
    assert "graph_scale" in scale["graph"]
    assert int(scale["cheap peak"]) <= int(scale["dask peak"])
