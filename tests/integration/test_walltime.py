"""Worker lifetimes and task budgets on real processes (loopback TCP).

- A worker with a short ``--lifetime`` hands its results to another worker and
  exits 0; with ``--lifetime-restart`` under a nanny, a fresh process takes its name.
- A task with a duration hint is not started on a worker with too little time left,
  but on a fresh one; until one comes it waits and the client is told why, once.
- ``LocalCluster(max_tasks=5)``: 100 tasks, at most 5 per worker process, all succeed.
- Bad lifetimes, budgets and durations are refused, naming the option.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from recording_scheduler import recording_scheduler, wait_for
from sizes import sized
from test_nanny import gone, worker_child, workers_named

from shoal import Client, LocalCluster
from shoal.protocol import messages as m


def pid_of_task(i: int) -> int:
    time.sleep(0.01)
    return os.getpid()


def import_path() -> str:
    """The import path of this process, for a worker that must import this module (as
    conftest.child_env, which a module imported by workers cannot import by name)."""
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    return os.pathsep.join(dict.fromkeys([os.getcwd(), *paths]))


def where(i: int) -> tuple[int, str]:
    return i, os.environ.get("SHOAL_TEST_NAME", "")


@pytest.mark.timeout(90)
def test_a_worker_at_the_end_of_its_lifetime_hands_off_its_results_and_exits(
    spawn: Callable[..., Any],
) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        keeper = spawn("worker", s.address, "--name", "keeper")
        short = spawn("worker", s.address, "--name", "short", "--lifetime", "6s")
        client.wait_for_workers(2, timeout=30)
        (short_address,) = workers_named(client, "short")
        (keeper_address,) = workers_named(client, "keeper")
        info = client.scheduler_info()["workers"]
        assert 0 < info[short_address]["lifetime_left"] <= 6.0
        assert info[keeper_address]["lifetime_left"] is None
        futs = client.map(pid_of_task, range(6), workers=["short"])
        pids = client.gather(futs)
        assert set(pids) == {short.pid}
        assert short.wait(30) == 0  # its lifetime is over: it left on its own
        wait_for(lambda: workers_named(client, "short") == [], 10, "short removed")
        # its results were copied to the keeper first: still there, nothing recomputed
        held = {ws.address for f in futs for ws in s.state.tasks[f.key].who_has}
        assert held == {keeper_address}
        assert client.gather(futs) == pids
        assert s.state.suspicious == {}  # nothing counted as a death
        assert keeper.poll() is None


@pytest.mark.timeout(90)
def test_with_lifetime_restart_the_nanny_starts_a_fresh_worker_under_the_same_name(
    spawn: Callable[..., Any],
) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        nanny = spawn(
            "worker", s.address, "--nanny", "--name", "w", "--lifetime", "5s",
            "--lifetime-restart",
        )  # fmt: skip
        client.wait_for_workers(1, timeout=30)
        first = worker_child(nanny)
        (first_address,) = workers_named(client, "w")
        (report,) = wait_for(lambda: s.recorded(m.WorkerExited), 30, "the nanny's report")
        assert report.restarting and report.name == "w" and report.address == first_address
        assert "lifetime" in report.reason
        wait_for(lambda: workers_named(client, "w") not in ([], [first_address]), 20, "new w")
        second = worker_child(nanny)
        assert second.pid != first.pid and gone(first)
        assert client.submit(os.getpid, pure=False).result(timeout=20) == second.pid
        assert s.state.suspicious == {}
        nanny.terminate()
        assert nanny.wait(15) == 0


@pytest.mark.timeout(90)
def test_a_hinted_task_waits_for_a_worker_with_time_and_the_client_is_told_once(
    spawn: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        spawn("worker", s.address, "--name", "old", "--lifetime", "60s")
        client.wait_for_workers(1, timeout=30)
        with caplog.at_level(logging.WARNING, logger="shoal.client"):
            short = client.submit(os.getpid, pure=False, duration="1s")
            assert short.result(timeout=20) > 0  # a short task runs on the old worker
            longs = [client.submit(where, i, duration="2m", pure=False) for i in range(3)]
            wait_for(
                lambda: [e for _, e in client.get_events("scheduling") if e["action"] == "unplaceable"],
                20,
                "the scheduling event",
            )  # fmt: skip
            time.sleep(0.5)  # it ran nowhere meanwhile
            assert not any(f.done() for f in longs)
            env = {**os.environ, "PYTHONPATH": import_path(), "SHOAL_TEST_NAME": "fresh"}
            spawn("worker", s.address, "--name", "fresh", "--lifetime", "1h", env=env)
            assert sorted(client.gather(longs)) == [(i, "fresh") for i in range(3)]
        events = [e for _, e in client.get_events("scheduling") if e["action"] == "unplaceable"]
        assert len(events) == 1
        (event,) = events
        assert event["duration"] == 120.0 and 0 < event["longest_left"] <= 60.0
        warnings = [r for r in caplog.records if "waits for a worker with time" in r.getMessage()]
        assert len(warnings) == 1
        assert "120s" in warnings[0].getMessage()


# Tasks of the max_tasks test: each 5 of them cost a worker process restart (about 1/3 s
# of the test's time apiece).
MAX_TASKS_RUN = sized(ci=40, full=100)


@pytest.mark.timeout(120)
def test_max_tasks_runs_at_most_that_many_tasks_per_worker_process() -> None:
    with (
        LocalCluster(n_workers=2, threads_per_worker=2, max_tasks=5, allowed_failures=0) as c,
        Client(c, timeout=30) as client,
    ):
        futs = client.map(pid_of_task, range(MAX_TASKS_RUN))
        pids = client.gather(futs, errors="raise")  # every task succeeds
        per_process = Counter(pids)
        assert len(pids) == MAX_TASKS_RUN
        assert max(per_process.values()) <= 5
        # fresh processes took over, again and again
        assert len(per_process) >= MAX_TASKS_RUN // 5


def test_bad_lifetimes_budgets_and_durations_are_refused() -> None:
    for args, option in [
        (["--lifetime", "-5m"], "--lifetime"),
        (["--lifetime", "soon"], "--lifetime"),
        (["--lifetime-stagger", "-1s"], "--lifetime-stagger"),
        (["--max-tasks", "0"], "--max-tasks"),
        (["--max-tasks", "five"], "--max-tasks"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "shoal", "worker", "tcp://127.0.0.1:9", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert f"{option} must be" in done.stderr, done.stderr
    with pytest.raises(ValueError, match="lifetime must be a duration"):
        LocalCluster(n_workers=0, lifetime="-1h")
    with pytest.raises(ValueError, match="max_tasks must be a whole number"):
        LocalCluster(n_workers=0, max_tasks=-3)
    with pytest.raises(ValueError, match="lifetime_stagger must be"):
        LocalCluster(n_workers=0, lifetime="1h", lifetime_stagger="x")
    with pytest.raises(ValueError, match="needs workers under a nanny"):
        LocalCluster(n_workers=0, processes=False, lifetime="1h", lifetime_restart=True)


def test_bad_durations_are_refused_by_the_call(inproc_cluster: LocalCluster) -> None:
    import dask

    with Client(inproc_cluster, timeout=30) as client:
        for bad in (-1, "-4h", "four hours", float("nan"), True):
            with pytest.raises(ValueError, match="duration= must be a duration"):
                client.submit(os.getpid, duration=bad)
            with pytest.raises(ValueError, match="duration= must be a duration"):
                client.map(where, [1], duration=bad)
        with dask.annotate(duration="-1s"), pytest.raises(ValueError, match="duration annotation"):
            client.compute(dask.delayed(where)(1))
        with dask.annotate(duration="10m"):
            assert client.compute(dask.delayed(where)(1)).result(timeout=20) == (1, "")


def slow_square(i: int) -> int:
    time.sleep(0.02)
    return i * i


@pytest.mark.timeout(60)
def test_a_task_sent_beyond_the_budget_is_refused_and_runs_elsewhere(
    inproc_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # The scheduler never sends more than a budget: here it does not know of one (the
    # worker said none when it joined), so the worker's own check is what holds.
    first = inproc_cluster._workers[0]
    first.lifetime.max_tasks = 2
    with Client(inproc_cluster, timeout=30) as client, caplog.at_level(logging.WARNING):
        futs = client.map(slow_square, range(20))
        assert client.gather(futs) == [i * i for i in range(20)]  # none lost, none erred
        assert first.lifetime.assigned == 2
        refused = [r for r in caplog.records if "beyond its budget" in r.getMessage()]
        assert refused
        assert "more than its 2 tasks" in first.leaving
        wait_for(lambda: len(client.scheduler_info()["workers"]) == 1, 20, "it to leave")
        wait_for(lambda: first.close_reason, 20, "it to close")
