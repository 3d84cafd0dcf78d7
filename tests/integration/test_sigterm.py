"""SIGTERM, as preemption and Dask's resilience notebook send it, on real processes.

- To a worker under a nanny: the worker hands the results only it holds to other
  workers, leaves the scheduler (nothing counts as a failure), and exits for its
  nanny to start a new one at once under the same name.
- To a worker without a nanny: the same hand-off, then it exits 0.
- To every worker of a cluster while tasks run: every task still finishes.
- To a nanny: the nanny and its worker are both gone within 2 s when idle, within
  the nanny's stop grace period while a task runs.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from recording_scheduler import recording_scheduler, wait_for
from test_nanny import gone, worker_child, workers_named

from shoal import Client, LocalCluster
from shoal.protocol import messages as m
from shoal.server.nanny import STOP_GRACE


def record(i: int, directory: str) -> int:
    """Leave a file per run, so a test can count how often each task ran."""
    Path(directory, f"{i}-{uuid.uuid4().hex}").touch()
    return i


def slow(i: int) -> int:
    time.sleep(0.05)
    return i


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def runs(directory: Path) -> dict[int, int]:
    counts: dict[int, int] = {}
    for p in directory.iterdir():
        i = int(p.name.split("-")[0])
        counts[i] = counts.get(i, 0) + 1
    return counts


def holders(s: Any, futs: list[Any]) -> set[str]:
    """The workers the (recording) scheduler says hold the futures' results (read
    from this thread while the cluster is quiet)."""
    return {ws.address for f in futs for ws in s.state.tasks[f.key].who_has}


@pytest.mark.timeout(90)
def test_sigterm_to_a_worker_under_a_nanny_hands_off_its_results_and_it_is_restarted(
    spawn: Callable[..., Any], tmp_path: Path
) -> None:
    ran = tmp_path / "runs"
    ran.mkdir()
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        nannies = {name: spawn("worker", s.address, "--nanny", "--name", name) for name in "ab"}
        client.wait_for_workers(2, timeout=30)
        (old_a,) = workers_named(client, "a")
        first = worker_child(nannies["a"])
        futs = client.map(record, range(10), directory=str(ran), workers=["a"])
        assert client.gather(futs) == list(range(10))
        assert holders(s, futs) == {old_a}

        first.send_signal(signal.SIGTERM)
        (report,) = wait_for(lambda: s.recorded(m.WorkerExited), 20, "the nanny's report")
        assert report.restarting and report.name == "a" and report.address == old_a
        assert "restarting as it asked" in report.reason and "SIGTERM" in report.reason
        second = worker_child(nannies["a"])
        assert second.pid != first.pid and gone(first)
        wait_for(lambda: workers_named(client, "a") not in ([], [old_a]), 20, "a new worker a")
        # the results were handed off before it left: there, and never computed again
        (old_b,) = workers_named(client, "b")
        assert client.gather(futs) == list(range(10))
        assert holders(s, futs) == {old_b}
        assert runs(ran) == dict.fromkeys(range(10), 1)
        assert s.state.suspicious == {}  # nothing counted as a death
        assert nannies["a"].poll() is None and nannies["b"].poll() is None
        assert client.submit(os.getpid, pure=False, workers=["a"]).result(timeout=20) == second.pid
        for nanny in nannies.values():
            nanny.send_signal(signal.SIGTERM)
            assert nanny.wait(15) == 0


@pytest.mark.timeout(60)
def test_sigterm_to_a_worker_without_a_nanny_hands_off_and_exits_0(
    spawn: Callable[..., Any], tmp_path: Path
) -> None:
    ran = tmp_path / "runs"
    ran.mkdir()
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        workers = {name: spawn("worker", s.address, "--name", name) for name in "ab"}
        client.wait_for_workers(2, timeout=30)
        (b,) = workers_named(client, "b")
        futs = client.map(record, range(5), directory=str(ran), workers=["a"])
        assert client.gather(futs) == list(range(5))
        workers["a"].send_signal(signal.SIGTERM)
        assert workers["a"].wait(15) == 0
        wait_for(lambda: workers_named(client, "a") == [], 10, "worker a removed")
        assert holders(s, futs) == {b}  # handed off (the client has the small values anyway)
        assert client.gather(futs) == list(range(5))
        assert runs(ran) == dict.fromkeys(range(5), 1)
        assert s.state.suspicious == {}
        workers["b"].send_signal(signal.SIGTERM)
        assert workers["b"].wait(15) == 0


@pytest.mark.timeout(120)
def test_sigterm_to_every_worker_while_tasks_run_and_every_task_finishes() -> None:
    # allowed_failures=0: a single death counted against a task would err it
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, allowed_failures=0) as cluster,
        Client(cluster) as client,
    ):
        before = list(cluster.worker_pids)
        futs = client.map(slow, range(200))
        wait_for(lambda: sum(f.done() for f in futs) >= 10, 30, "some tasks done")
        for pid in before:
            os.kill(pid, signal.SIGTERM)
        assert client.gather(futs) == list(range(200))
        wait_for(lambda: len(cluster.worker_pids) == 2, 20, "two workers again")
        assert not set(cluster.worker_pids) & set(before)
        client.wait_for_workers(2, timeout=20)
        assert client.submit(slow, 1000).result(timeout=20) == 1000


def _wait_gone(procs: list[psutil.Process], timeout: float) -> float:
    start = time.monotonic()
    wait_for(lambda: all(gone(p) for p in procs), timeout, "nanny and worker to exit")
    return time.monotonic() - start


@pytest.mark.timeout(30)
def test_sigterm_to_an_idle_nanny_ends_both_within_2s(spawn: Callable[..., Any]) -> None:
    with recording_scheduler() as s:
        nanny = spawn("worker", s.address, "--nanny", "--name", "w")
        worker = worker_child(nanny)
        wait_for(lambda: s.state.workers, 20, "the worker to join")
        nanny.send_signal(signal.SIGTERM)
        took = _wait_gone([psutil.Process(nanny.pid), worker], 2.0)
        assert nanny.wait(1) == 0
        assert took < 2.0
        assert s.recorded(m.WorkerExited) == []  # asked to stop: nothing to report


@pytest.mark.timeout(60)
def test_sigterm_to_a_nanny_with_a_task_running_ends_both_within_the_grace(
    spawn: Callable[..., Any],
) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        nanny = spawn("worker", s.address, "--nanny", "--name", "w")
        worker = worker_child(nanny)
        client.wait_for_workers(1, timeout=20)
        fut = client.submit(sleep, 120)
        key = fut.key
        running = lambda: getattr(s.state.tasks.get(key), "state", "") == "processing"  # noqa: E731
        wait_for(running, 10, "the task to run")
        time.sleep(0.5)  # it is on a thread, sleeping
        nanny.send_signal(signal.SIGTERM)
        _wait_gone([psutil.Process(nanny.pid), worker], STOP_GRACE + 2)
        assert nanny.wait(1) == 0
