"""``client.restart()`` on real processes: every worker restarted through its nanny,
every future cancelled, datasets dropped, and the cluster usable again."""

from __future__ import annotations

import os
import time

import pytest

from shoal import CancelledError, Client, LocalCluster


def test_restart_replaces_every_worker_process_and_clears_state() -> None:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, timeout=60) as cluster,
        Client(cluster, timeout=30) as c,
        Client(cluster, timeout=30) as other,
    ):
        pids = set(c.run(os.getpid).values())
        nannies = sorted(cluster.nanny_pids)
        done = c.submit(sum, [1, 2])
        assert done.result(timeout=10) == 3
        running = other.submit(time.sleep, 30, pure=False)
        c.publish_dataset(kept=done)
        c.restart(timeout=60)
        assert len(c.scheduler_info()["workers"]) == 2
        new_pids = set(c.run(os.getpid).values())
        assert len(new_pids) == 2 and not new_pids & pids  # fresh processes
        assert sorted(cluster.nanny_pids) == nannies  # through the same nannies
        with pytest.raises(CancelledError):
            done.result(timeout=10)
        with pytest.raises(CancelledError):
            running.result(timeout=10)  # another client's future too
        assert c.list_datasets() == []
        assert c.submit(sum, [2, 3]).result(timeout=20) == 5  # usable again
        assert other.submit(sum, [1, 2]).result(timeout=20) == 3  # same key, computed anew


def test_restart_without_nannies_is_refused_changing_nothing() -> None:
    with (
        LocalCluster(n_workers=1, processes=False, timeout=30) as cluster,
        Client(cluster, timeout=30) as c,
    ):
        f = c.submit(sum, [1, 2])
        assert f.result(timeout=10) == 3
        with pytest.raises(RuntimeError, match="needs every worker under a nanny"):
            c.restart()
        assert f.result(timeout=10) == 3 and not f.cancelled()


def read_number(path: str) -> int:
    with open(path) as f:  # FileNotFoundError until the test writes it
        return int(f.read())


def double(x: int) -> int:
    return 2 * x


def test_retry_runs_erred_tasks_again_through_their_erred_dependencies(
    client: Client, tmp_path: object
) -> None:
    path = os.path.join(str(tmp_path), "number")
    source = client.submit(read_number, path, pure=False)
    doubled = client.submit(double, source)
    with pytest.raises(FileNotFoundError):
        doubled.result(timeout=20)
    assert source.status == "error"
    with open(path, "w") as f:
        f.write("21")
    doubled.retry()  # re-runs source too: doubled failed through it
    assert doubled.result(timeout=20) == 42
    assert source.result(timeout=20) == 21
    fine = client.submit(double, 1)
    assert fine.result(timeout=10) == 2
    client.retry([fine])  # not in error: left as it is
    assert fine.status == "finished" and fine.result(timeout=10) == 2
