"""Work stealing on real worker processes: tasks placed by data locality while their
prefix was measured fast, and then slow, move to the idle worker when stealing is on,
and stay queued on the busy one when it is off; every result arrives once."""

from __future__ import annotations

import pytest
from steal_tasks import getpid, work

from shoal import Client, LocalCluster

pytestmark = pytest.mark.timeout(90)


def run_unequal(work_stealing: bool) -> tuple[int, list[int]]:
    """Data on worker "0" (0.02 s to move); ten 1 ms tasks, then ten 0.4 s ones that
    need it.
    The pid of worker "0", and the pids that ran the slow tasks."""
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            timeout=60,
            validate=True,
            work_stealing=work_stealing,
        ) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        holder = client.submit(getpid, workers=["0"], pure=False).result()
        [data, small] = client.scatter([b"x" * 2_000_000, b"y"], workers=["0"])
        # (other data: the worker that may run some of these must not get a copy of "data")
        fast = [client.submit(work, small, 0.001, key=f"work-{i}") for i in range(10)]
        client.gather(fast)  # the prefix "work" is measured at ~1 ms
        slow = [client.submit(work, data, 0.4, key=f"work-{i}") for i in range(10, 20)]
        return holder, client.gather(slow)


def test_slow_tasks_queued_on_the_data_holder_are_stolen_by_the_idle_worker():
    holder, pids = run_unequal(work_stealing=True)
    assert len(pids) == 10
    assert any(pid != holder for pid in pids), "nothing moved to the idle worker"


def test_without_stealing_they_all_run_where_the_data_is():
    """The premise of the test above: placement alone keeps them on the holder."""
    holder, pids = run_unequal(work_stealing=False)
    assert pids == [holder] * 10
