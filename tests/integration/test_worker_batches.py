"""Task threads take the tasks to run in batches (one hand-off per batch, not per task).

A task that secedes ends its thread once it returns; the tasks queued behind it in the
same batch must go on to another thread, not wait for it (nor be lost). Task functions
live at module level so that worker processes can import them by name.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import shoal
from shoal import Client, LocalCluster


def touch(directory: str, i: int) -> int:
    Path(directory, f"done-{i}").touch()
    return i


def secede_until_touched(directory: str, n: int) -> int:
    """Secede, then wait (up to 20 s) for ``n`` sibling tasks to have run."""
    shoal.secede()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done = len([f for f in os.listdir(directory) if f.startswith("done-")])
        if done >= n:
            return done
        time.sleep(0.01)
    return len([f for f in os.listdir(directory) if f.startswith("done-")])


@pytest.mark.timeout(90)
def test_tasks_behind_a_seceding_task_in_its_batch_still_run(tmp_path: Path):
    n = 30
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        warm = tmp_path / "warm"
        warm.mkdir()
        # short tasks measured first: later ones are handed to the thread many at a time
        assert client.gather(client.map(touch, [str(warm)] * 40, range(40))) == list(range(40))
        for _ in range(3):  # the seceding task, with its siblings queued behind it
            run = tmp_path / f"run-{_}"
            run.mkdir()
            waiting = client.submit(secede_until_touched, str(run), n, priority=10, pure=False)
            siblings = client.map(touch, [str(run)] * n, range(n), pure=False)
            assert waiting.result(timeout=60) == n
            assert client.gather(siblings) == list(range(n))
