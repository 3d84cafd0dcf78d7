"""``cluster.scale(n)`` on process and in-process LocalClusters: workers start, extra
ones retire gracefully (their data copied first, nothing recomputed), and a retired
worker's process is reaped, never restarted by its nanny."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil
import pytest
from scale_tasks import record, runs

from shoal import Client, LocalCluster

pytestmark = pytest.mark.timeout(60)


def wait_until(condition: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.05)


def n_workers(client: Client) -> int:
    return len(client.scheduler_info()["workers"])


def holding(client: Client) -> int:
    """Bytes of results the workers hold."""
    return sum(w["nbytes"] for w in client.scheduler_info()["workers"].values())


def test_scale_up_then_down_keeps_the_data_and_recomputes_nothing(tmp_path):
    path = str(tmp_path / "runs")
    with (
        LocalCluster(n_workers=1, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        cluster.scale(3)
        client.wait_for_workers(3, timeout=20)
        assert n_workers(client) == 3
        futures = client.map(record, range(12), path=path, seconds=0.05)
        assert [f.result(timeout=20)[0] for f in futures] == list(range(12))
        holders = [w for w in client.scheduler_info()["workers"].values() if w["nbytes"]]
        assert len(holders) > 1  # the data is spread: retiring must copy some of it
        nannies = set(cluster.nanny_pids)

        cluster.scale(1)
        wait_until(lambda: n_workers(client) == 1, what="two workers to retire")
        wait_until(lambda: len(cluster.nanny_pids) == 1, what="their nannies to be reaped")
        gone = nannies - set(cluster.nanny_pids)
        assert len(gone) == 2
        for pid in gone:  # exited and reaped: not even a zombie
            assert not psutil.pid_exists(pid)
        time.sleep(1.0)
        assert n_workers(client) == 1  # no nanny restarted its worker
        assert [f.result(timeout=20) for f in futures] == [[i] * 1000 for i in range(12)]
        assert sorted(runs(path)) == list(range(12))  # every result ran exactly once

        cluster.scale(2)
        client.wait_for_workers(2, timeout=20)
        names = {w["name"] for w in client.scheduler_info()["workers"].values()}
        assert len(names) == 2 and "3" in names  # a new worker under a new name


def test_scale_from_zero_workers_to_some_and_back_to_none():
    with (
        LocalCluster(n_workers=0, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        assert n_workers(client) == 0 and cluster.worker_pids == []
        cluster.scale(2)
        client.wait_for_workers(2, timeout=20)
        assert client.submit(sum, [1, 2]).result(timeout=20) == 3
        wait_until(lambda: holding(client) == 0, what="the result to be released")
        cluster.scale(0)
        wait_until(lambda: n_workers(client) == 0, what="every worker to retire")
        wait_until(lambda: cluster.nanny_pids == [], what="the nannies to be reaped")


def test_scale_down_keeps_a_worker_while_it_holds_the_only_copy():
    with (
        LocalCluster(n_workers=1, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        future = client.submit(sum, [1, 2])
        assert future.result(timeout=20) == 3
        cluster.scale(0)
        time.sleep(0.5)
        assert n_workers(client) == 1  # nowhere to copy its data: kept
        del future
        wait_until(lambda: holding(client) == 0, what="the result to be released")
        cluster.scale(0)
        wait_until(lambda: n_workers(client) == 0, what="the worker to retire")


def test_scale_in_process_cluster(tmp_path):
    path = str(tmp_path / "runs")
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False) as cluster,
        Client(cluster) as client,
    ):
        cluster.scale(3)
        client.wait_for_workers(3, timeout=20)
        futures = client.map(record, range(6), path=path)
        client.gather(futures)
        cluster.scale(1)
        wait_until(lambda: n_workers(client) == 1, what="two workers to retire")
        wait_until(lambda: len(cluster._workers) == 1, what="their Worker objects to go")
        assert [f.result(timeout=20)[0] for f in futures] == list(range(6))
        assert sorted(runs(path)) == list(range(6))


def test_scale_bad_input():
    with LocalCluster(n_workers=0, processes=False) as cluster:
        for bad in (-1, 1.5, "2", True):
            with pytest.raises(ValueError, match="scale"):
                cluster.scale(bad)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="closed"):
        cluster.scale(1)
