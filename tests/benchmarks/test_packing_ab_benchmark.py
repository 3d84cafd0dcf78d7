"""benchmarks/packing_ab.py at a tiny size: a placement rule on and off on one cluster,
a table."""

from __future__ import annotations

import pytest
from benchmark_script import run_script


@pytest.mark.parametrize(
    "rule, cells, on, off",
    [
        ("packing", ["array_sum", "delayed_sum"], "packed", "spread"),
        ("ahead-data", ["merge"], "on", "off"),
        ("order-cache", ["array_sum"], "on", "off"),
        ("worker-batch", ["array_sum"], "on", "off"),
        ("lanes", ["delayed_sum"], "on", "off"),
    ],
)
def test_packing_ab_tiny(rule: str, cells: list[str], on: str, off: str):
    args = ["--repeat", "2", "--quick", "--only", ",".join(cells), "--rule", rule]
    res = run_script("packing_ab.py", args, 140)
    assert res.returncode == 0, res.stderr[-4000:]
    lines = [line for line in res.stdout.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == [
        "cell",
        "sync ms",
        f"{on} ms",
        f"{off} ms",
        f"{on}/sync",
        f"{off}/sync",
        f"{on}/{off}",
    ]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]
    assert [r[0] for r in rows] == cells
    for row in rows:
        sync, with_rule, without, on_ratio, off_ratio, ab = map(float, row[1:])
        assert 0 < sync < 10_000 and 0 < with_rule < 10_000 and 0 < without < 10_000, row
        assert on_ratio == pytest.approx(with_rule / sync, rel=0.05, abs=0.01)
        assert off_ratio == pytest.approx(without / sync, rel=0.05, abs=0.01)
        assert ab == pytest.approx(with_rule / without, rel=0.01, abs=0.002)


def test_packing_ab_rejects_an_unknown_cell():
    res = run_script("packing_ab.py", ["--only", "nope"], 60)
    assert res.returncode == 2 and "unknown cell 'nope'" in res.stderr
