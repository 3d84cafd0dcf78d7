"""Cancel frees what it says, on real processes (issue 11).

- A cancelled task whose thread still runs keeps that thread counted busy: nothing is
  sent to wait behind it, so every later task runs (the issue's scenario: a task that
  sleeps forever on a one-thread worker, cancelled, then 40 tasks).
- ``cancel(force=True)`` interrupts a running task with TaskInterrupted raised in its
  thread: a pure-Python loop stops and its thread takes new tasks.
- A task that cannot be interrupted (``time.sleep`` in C) is stopped by restarting its
  worker through the nanny after the grace period: nothing counts as a failure (the
  cluster allows none), the worker's other running task runs again, later tasks run.
- Without a nanny the worker says it cannot stop the thread, and that thread stays
  counted busy until it returns.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recording_scheduler import wait_for

from shoal import Client, LocalCluster, TaskInterrupted, wait

TIMEOUT = 30  # seconds for work that should be quick


def inc(x: int) -> int:
    return x + 1


def getpid(_: Any = None) -> int:
    return os.getpid()


def sleep_until(started: str, stop: str) -> str:
    """Run "forever": until ``stop`` exists (a test ends it at teardown)."""
    Path(started).touch()
    while not os.path.exists(stop):
        time.sleep(0.05)
    return "stopped"


def spin(started: str, interrupted: str) -> int:
    """A pure-Python busy loop, with no end of its own."""
    Path(started).touch()
    n = 0
    try:
        while True:
            n += 1
    except TaskInterrupted:
        Path(interrupted).touch()
        raise


def sleep_in_c(started: str, seconds: float) -> float:
    """Blocked in C: an interrupt reaches it only once the sleep returns."""
    Path(started).touch()
    time.sleep(seconds)
    return seconds


def slow_value(started: str, seconds: float) -> str:
    Path(started).touch()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "finished"


def worker_of(client: Client, name: str) -> dict[str, Any]:
    """The scheduler's record of the worker named ``name``, with its address."""
    workers = client.scheduler_info()["workers"].items()
    [info] = [{**w, "address": a} for a, w in workers if w["name"] == name]
    return info


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Two one-thread workers under nannies; none may die under a task (KilledWorker
    at once), and a stuck interrupted task restarts its worker after 1 s."""
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        timeout=60,
        validate=True,
        allowed_failures=0,
        interrupt_grace=1.0,
    ) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster, timeout=30) as c:
        c.wait_for_workers(2)
        yield c


def test_a_cancelled_task_that_runs_on_keeps_its_thread_and_later_tasks_all_run(
    client: Client, tmp_path: Path
):
    """The issue's scenario. Before: the scheduler counted the thread free at once and
    sent tasks to wait behind the sleeper, where they never ran."""
    started, stop = tmp_path / "started", tmp_path / "stop"
    try:
        busy = worker_of(client, "0")["address"]
        sleeper = client.submit(sleep_until, str(started), str(stop), workers=[busy])
        wait_for(started.exists, TIMEOUT, "the sleeper started")
        sleeper.cancel()
        futs = client.map(inc, range(40), pure=False)
        done, not_done = wait(futs, timeout=TIMEOUT)
        assert not not_done, f"{len(not_done)} of 40 tasks never ran"
        assert client.gather(futs) == [i + 1 for i in range(40)]
        assert sleeper.cancelled()
        # once the sleeper's thread really returns, its worker takes tasks again
        stop.touch()
        pinned = client.submit(getpid, 0, workers=[busy], pure=False)
        assert pinned.result(timeout=TIMEOUT) == worker_of(client, "0")["pid"]
    finally:
        stop.touch()


def test_force_cancel_interrupts_a_python_loop_and_frees_its_thread(client: Client, tmp_path: Path):
    started, interrupted = tmp_path / "started", tmp_path / "interrupted"
    before = worker_of(client, "0")
    spinner = client.submit(spin, str(started), str(interrupted), workers=[before["address"]])
    wait_for(started.exists, TIMEOUT, "the loop started")
    client.cancel([spinner], force=True)
    wait_for(interrupted.exists, TIMEOUT, "TaskInterrupted raised in the task's thread")
    # the same worker process (not restarted) runs the next tasks on that thread
    futs = [client.submit(getpid, i, workers=[before["address"]]) for i in range(5)]
    assert client.gather(futs, errors="raise") == [before["pid"]] * 5
    assert worker_of(client, "0")["pid"] == before["pid"]
    assert spinner.cancelled()


def test_force_cancel_of_a_task_blocked_in_c_restarts_its_worker_without_a_failure(
    tmp_path: Path,
):
    """``time.sleep`` cannot be interrupted: after the grace period the worker restarts
    through its nanny. The cluster allows no failure, so a task counted as killed by
    it would err with KilledWorker: the other task running there runs again instead."""
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            timeout=60,
            validate=True,
            allowed_failures=0,
            interrupt_grace=1.0,
        ) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        before = worker_of(client, "0")
        asleep, other = tmp_path / "asleep", tmp_path / "other"
        stuck = client.submit(sleep_in_c, str(asleep), 3600)
        neighbour = client.submit(slow_value, str(other), 3.0)
        wait_for(lambda: asleep.exists() and other.exists(), TIMEOUT, "both started")
        client.cancel([stuck], force=True)

        def restarted() -> bool:
            workers = client.scheduler_info()["workers"].values()
            return any(w["name"] == "0" and w["pid"] != before["pid"] for w in workers)

        wait_for(restarted, TIMEOUT, "the worker restarted under the same name")
        assert neighbour.result(timeout=TIMEOUT) == "finished"  # not KilledWorker
        futs = client.map(inc, range(40), pure=False)
        assert client.gather(futs) == [i + 1 for i in range(40)]
        assert len(client.scheduler_info()["workers"]) == 1
        assert stuck.cancelled()


def test_without_a_nanny_a_stuck_thread_is_reported_and_stays_counted_busy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    asleep = tmp_path / "asleep"
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            timeout=30,
            validate=True,
            interrupt_grace=0.3,
        ) as cluster,
        Client(cluster, timeout=30) as client,
        caplog.at_level(logging.ERROR, logger="shoal.worker"),
    ):
        busy = worker_of(client, "0")["address"]
        stuck = client.submit(sleep_in_c, str(asleep), 4.0, workers=[busy])
        wait_for(asleep.exists, TIMEOUT, "the sleep started")
        client.cancel([stuck], force=True)
        wait_for(lambda: "no nanny to restart it" in caplog.text, TIMEOUT, "the error logged")
        # while the thread sleeps on, nothing waits behind it on that worker
        futs = client.map(inc, range(40), pure=False)
        assert client.gather(futs) == [i + 1 for i in range(40)]
        # once the sleep returns the interrupt lands, and the worker takes tasks again
        pinned = client.submit(inc, 1, workers=[busy], pure=False)
        assert pinned.result(timeout=TIMEOUT) == 2
