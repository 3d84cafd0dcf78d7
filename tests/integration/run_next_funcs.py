"""Tasks for test_run_next (importable by the workers)."""

from __future__ import annotations

import time
from typing import Any

import shoal

_runs: dict[str, int] = {}  # task name -> executions in this worker process


def step(x: int) -> int:
    """A task that runs on a thread (not one of the loop's builtins)."""
    return x + 1


def slow_step(x: int) -> int:
    """``step``, long enough for its dependent to arrive while it runs."""
    time.sleep(0.05)
    return x + 1


def counted_failure(x: int, name: str) -> int:
    """Raise, counting each execution in this worker process."""
    _runs[name] = _runs.get(name, 0) + 1
    raise ValueError(f"{name} failed on {x}")


def executions(name: str, dask_worker: Any = None) -> int:
    return _runs.get(name, 0)


def secede_rejoin(x: int) -> int:
    """Leave the thread count and come back, as a task waiting on others does."""
    shoal.secede()
    shoal.rejoin()
    return x * 10


def submit_from_task(x: int) -> int:
    """Wait, from a task, on a task that needs this worker's only thread."""
    here = shoal.get_worker().address
    with shoal.worker_client() as client:
        return client.submit(step, x, workers=here, pure=False).result(timeout=30) * 100


def early_runs(dask_worker: Any) -> tuple[int, int, int]:
    """(run early, delivered at their Execute, dropped) on this worker."""
    offers = dask_worker._run_next
    if offers is None:
        return (0, 0, 0)
    return (offers.early_runs, offers.delivered, offers.discarded)
