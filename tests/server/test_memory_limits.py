"""Memory limits and thresholds: parsing, and the monitor that spills and pauses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest

from shoal.server.memory import (
    MemoryFractions,
    MemoryMonitor,
    parse_bytes,
    parse_fraction,
    parse_memory_limit,
    process_memory,
    total_memory,
)
from shoal.server.spill import SpillBuffer

pytestmark = pytest.mark.timeout(30)


def test_parse_bytes() -> None:
    assert parse_bytes("4GiB") == 4 * 2**30
    assert parse_bytes("200MB") == 200_000_000
    assert parse_bytes("200 mb") == 200_000_000
    assert parse_bytes("2e9") == 2_000_000_000
    assert parse_bytes("1.5kib") == 1536
    assert parse_bytes("123") == 123
    for bad in ("", "GB", "4 parsecs", "-1MB"):
        with pytest.raises(ValueError, match="not an amount of memory"):
            parse_bytes(bad)


def test_parse_memory_limit() -> None:
    total = total_memory()
    ncores = psutil.cpu_count() or 1
    assert parse_memory_limit("200MB") == 200_000_000
    assert parse_memory_limit("2e9") == min(total, 2_000_000_000)
    assert parse_memory_limit(3e8) == 300_000_000
    assert parse_memory_limit("0.5") == int(total * 0.5)  # a fraction of the machine
    assert parse_memory_limit("auto", nthreads=1) == int(total * min(1.0, 1 / ncores))
    assert parse_memory_limit(None, nthreads=10_000) == total
    assert parse_memory_limit("1000TiB") == total  # never more than the machine has
    assert parse_memory_limit("none") is None
    assert parse_memory_limit("0") is None
    with pytest.raises(ValueError):
        parse_memory_limit("-5")
    with pytest.raises(ValueError):
        parse_memory_limit("lots")


def test_parse_fraction() -> None:
    assert parse_fraction("0.6") == 0.6
    assert parse_fraction(0.95) == 0.95
    assert parse_fraction("off") is None and parse_fraction("0") is None
    with pytest.raises(ValueError):
        parse_fraction("1.5")


def test_monitor_spills_then_pauses_then_resumes(tmp_path: Path) -> None:
    data = SpillBuffer(str(tmp_path))
    for i in range(3):
        data[i] = np.full(1_000_000, float(i))
    calls: list[bool] = []
    # A limit this process is over whatever is spilled: it spills everything, then pauses.
    # (Not a fraction of the RSS measured here: in a test process shared with other
    # tests, memory freed in between by their threads can bring the RSS under it.)
    monitor = MemoryMonitor(1, MemoryFractions(), data, calls.append)
    monitor.check()
    assert data.spilled_keys == {0, 1, 2}
    assert calls == [True]
    monitor.check()
    assert calls == [True]  # still over: nothing new to say
    monitor.limit = process_memory() * 100
    monitor.check()
    assert calls == [True, False]
    assert data[1][0] == 1.0


def test_monitor_with_thresholds_off_does_nothing(tmp_path: Path) -> None:
    data = SpillBuffer(str(tmp_path))
    data["x"] = np.ones(1_000_000)
    calls: list[bool] = []
    monitor = MemoryMonitor(1, MemoryFractions(None, None, None, None), data, calls.append)
    monitor.check()
    assert calls == [] and data.spilled_keys == set()
