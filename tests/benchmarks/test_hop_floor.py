"""``benchmarks/hop_floor.py``: a tiny run answers every compute through each path."""

from __future__ import annotations

import pytest
from benchmark_script import run_script


@pytest.mark.timeout(240)
def test_hop_floor_tiny() -> None:
    proc = run_script("hop_floor.py", ["--rounds", "3", "--pause", "0.01"], timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): line
        for line in proc.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| scheduler")
    }
    assert set(rows) == {
        "sync",
        "no-op",
        "loop-thread",
        "caller-reads",
        "direct",
        "leased",
        "shoal",
    }
    assert rows["sync"].split("|")[4].strip() == "1.00"
