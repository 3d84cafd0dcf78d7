"""Task functions for test_lanes.py (importable by the workers)."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any


def double(x: int) -> int:
    return 2 * x


def fail(x: int) -> int:
    raise ValueError(f"lane task failed on {x}")


def chatty(x: int) -> int:
    print(f"printed by the task of {x}")
    warnings.warn(f"warned by the task of {x}", UserWarning, stacklevel=1)
    return x


def wait_for_file(path: str, timeout: float = 60) -> str:
    """Block until ``path`` exists (a worker kept busy on demand)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "released"


def block_until(started: str, stop: str) -> str:
    """Say it started, then keep its worker busy until ``stop`` exists."""
    Path(started).write_text(str(os.getpid()))
    return wait_for_file(stop)


def first_run_hangs(marker: str, started: str) -> int:
    """The first run (anywhere) marks ``marker``, says it started, then hangs; any
    later run returns at once: the caller sees 7 only from a run after the first."""
    if not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        Path(started).write_text(str(os.getpid()))
        time.sleep(120)
        return -1
    return 7


def ran_where(x: Any) -> tuple[int, Any]:
    return os.getpid(), x


def nested_get(x: int) -> int:
    """A lane's task that computes through the worker's client (get_client works)."""
    import dask

    from shoal import get_client

    client = get_client()
    return int(dask.delayed(double)(x).compute(scheduler=client.get)) + 1


def big_bytes(n: int) -> bytes:
    return bytes(range(256)) * (n // 256)


def big_array(n: int) -> Any:
    import numpy as np

    return np.arange(n, dtype="float64")


def maybe_fail(x: int, fail: bool) -> int:
    """Fails only when asked: its prefix is measured from its runs that pass."""
    if fail:
        raise ValueError(f"graph task failed on {x}")
    return x


def nap(x: int, seconds: float) -> int:
    time.sleep(seconds)
    return x


def hangs_first(x: int, marker: str, started: str) -> int:
    """``first_run_hangs`` for a graph: with ``marker`` absent, marks it, says it
    started and hangs; else returns ``x`` at once (its prefix measured then)."""
    if not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        Path(started).write_text(str(os.getpid()))
        time.sleep(120)
        return -1
    return x


def block(n: int) -> Any:
    import numpy as np

    return np.ones(n)
