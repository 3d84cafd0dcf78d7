"""Worker processes run under Linux's SCHED_BATCH (shoal/server/cpu_policy.py), every
thread of them; the scheduler and the client do not; ``--no-batch-scheduling`` and the
``worker.batch-scheduling`` setting turn it off, through a nanny too."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import dask
import pytest
from recording_scheduler import recording_scheduler, wait_for
from test_nanny import stop_nanny, worker_child

from shoal import Client, LocalCluster

pytestmark = pytest.mark.skipif(
    not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's scheduling policy"
)


def thread_policies() -> set[int]:
    """The scheduling policy of every thread of this process."""
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir("/proc/self/task")}


def test_use_batch_scheduling_covers_threads_started_before_and_after() -> None:
    script = """
import os, threading
from shoal.server.cpu_policy import use_batch_scheduling
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
assert os.sched_getscheduler(before.native_id) == os.SCHED_OTHER
assert use_batch_scheduling()
after = threading.Thread(target=stop.wait); after.start()
print(sorted(os.sched_getscheduler(t.native_id) for t in (threading.main_thread(), before, after)))
stop.set()
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == [f"[{os.SCHED_BATCH},", f"{os.SCHED_BATCH},", f"{os.SCHED_BATCH}]"]


@pytest.mark.timeout(120)
def test_workers_run_under_batch_and_the_scheduler_and_client_do_not() -> None:
    with LocalCluster(n_workers=2, threads_per_worker=2) as cluster, Client(cluster) as client:
        on_workers = client.run(thread_policies)
        assert len(on_workers) == 2
        assert all(policies == {os.SCHED_BATCH} for policies in on_workers.values())
        assert client.run_on_scheduler(thread_policies) == {os.SCHED_OTHER}
        assert thread_policies() == {os.SCHED_OTHER}
        assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["argument", "config"])
def test_local_cluster_turns_it_off(how: str) -> None:
    kwargs = {"batch_scheduling": False} if how == "argument" else {}
    with (
        dask.config.set({"shoal.worker.batch-scheduling": how != "config"}),
        LocalCluster(n_workers=1, threads_per_worker=1, **kwargs) as cluster,
        Client(cluster) as client,
    ):
        assert list(client.run(thread_policies).values()) == [{os.SCHED_OTHER}]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "flags, policy", [((), "SCHED_BATCH"), (("--no-batch-scheduling",), "SCHED_OTHER")]
)
def test_a_nanny_passes_it_to_its_worker_and_stays_as_it_was(
    spawn: Callable[..., Any], flags: tuple[str, ...], policy: str
) -> None:
    with recording_scheduler() as s, Client(s.address, timeout=30) as client:
        nanny = spawn("worker", s.address, "--nanny", "--name", "w", *flags)
        worker = worker_child(nanny)
        client.wait_for_workers(1, timeout=30)
        wait_for(lambda: client.run(thread_policies) or None, 20, "the worker answering")
        assert list(client.run(thread_policies).values()) == [{getattr(os, policy)}]
        assert os.sched_getscheduler(worker.pid) == getattr(os, policy)
        assert os.sched_getscheduler(nanny.pid) == os.SCHED_OTHER
        stop_nanny(nanny)


def test_a_setting_that_is_not_a_bool_is_refused_by_name() -> None:
    with (
        dask.config.set({"shoal.worker.batch-scheduling": "false"}),  # as a variable gives it
        pytest.raises(ValueError, match=r"shoal\.worker\.batch-scheduling.*'false'"),
    ):
        LocalCluster(n_workers=0)
