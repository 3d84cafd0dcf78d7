"""Placement restrictions on real processes: ``resources=``, ``workers=`` and
``allow_other_workers=`` through the client, the scheduler and the workers.

The module's cluster: a scheduler and a plain worker (a ``LocalCluster``, worker name
"0") and a worker started from the command line with one GPU (name "gpu"); two threads
each, so that only the GPU count, not the threads, keeps GPU tasks apart. Tasks report
``os.getpid()`` to say which worker ran them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from shoal import Client, LocalCluster, wait

pytestmark = pytest.mark.timeout(60)


def inc(x):
    return x + 1


def pid_after(seconds, tag):
    time.sleep(seconds)
    return os.getpid()


def timed_span(seconds, tag):
    """Which process ran us, and from when to when (one clock: the same machine)."""
    start = time.time()
    time.sleep(seconds)
    return os.getpid(), start, time.time()


def most_at_once(spans: list[tuple[int, float, float]]) -> int:
    """The most spans running at the same moment."""
    edges = sorted([(start, 1) for _, start, _ in spans] + [(stop, -1) for _, _, stop in spans])
    running = most = 0
    for _, change in edges:  # at a tie, an end (-1) sorts before a start: not overlapping
        running += change
        most = max(most, running)
    return most


class GpuCluster:
    def __init__(self, cluster: LocalCluster, gpu: subprocess.Popen[bytes]):
        self.cluster = cluster
        self.address = cluster.scheduler_address
        self.plain_pid = cluster.worker_pids[0]
        self.gpu_pid = gpu.pid


def _child_env() -> dict[str, str]:
    env = dict(os.environ)  # the worker imports this module by name: same path as ours
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *paths]))
    return env


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[GpuCluster]:
    with LocalCluster(n_workers=1, threads_per_worker=2, timeout=60, validate=True) as cluster:
        gpu = subprocess.Popen(
            [sys.executable, "-m", "shoal", "worker", cluster.scheduler_address]
            + ["--nthreads", "2", "--name", "gpu", "--resources", "GPU=1", "--validate"],
            env={**_child_env(), **cluster.security.to_env()},  # its token
            stdin=subprocess.DEVNULL,
        )
        try:
            cluster.wait_for_workers(2, timeout=30)
            yield GpuCluster(cluster, gpu)
        finally:
            gpu.terminate()
            try:
                gpu.wait(10)
            except subprocess.TimeoutExpired:
                gpu.kill()
                gpu.wait(10)


@pytest.fixture
def client(gpu_cluster: GpuCluster) -> Iterator[Client]:
    with Client(gpu_cluster.address, timeout=30) as c:
        yield c


def worker_address(client: Client, name: str) -> str:
    workers = client.scheduler_info()["workers"]
    (address,) = [a for a, w in workers.items() if w["name"] == name]
    return address


def test_workers_report_their_resources(client: Client) -> None:
    workers = client.scheduler_info()["workers"].values()
    assert sorted((w["name"], w["resources"]) for w in workers) == [
        ("0", {}),
        ("gpu", {"GPU": 1.0}),
    ]


def test_gpu_tasks_run_only_on_the_gpu_worker_and_one_at_a_time(
    client: Client, gpu_cluster: GpuCluster
) -> None:
    spans = client.gather(
        client.map(timed_span, [0.2] * 5, range(5), resources={"GPU": 1}, pure=False),
    )
    assert {pid for pid, _, _ in spans} == {gpu_cluster.gpu_pid}
    assert most_at_once(spans) == 1, f"GPU tasks ran at the same time: {spans}"
    # meanwhile, plain tasks still use every thread of both workers
    pids = client.gather(client.map(pid_after, [0.05] * 20, range(20), pure=False))
    assert set(pids) == {gpu_cluster.plain_pid, gpu_cluster.gpu_pid}


def test_workers_pins_tasks_by_address_or_by_name(client: Client, gpu_cluster: GpuCluster) -> None:
    plain = worker_address(client, "0")
    pinned = client.map(pid_after, [0.02] * 10, range(10), workers=[plain], pure=False)
    assert set(client.gather(pinned)) == {gpu_cluster.plain_pid}
    by_name = client.submit(pid_after, 0.0, "named", workers="gpu", pure=False)
    assert by_name.result(timeout=30) == gpu_cluster.gpu_pid


def test_allow_other_workers_with_a_missing_worker_still_runs(client: Client) -> None:
    loose = client.submit(inc, 1, workers="tcp://127.0.0.1:1", allow_other_workers=True)
    assert loose.result(timeout=30) == 2


def test_a_task_for_a_missing_worker_waits_without_holding_up_others(client: Client) -> None:
    stuck = client.submit(inc, 10, workers=["no-such-worker"], priority=10)
    others = client.map(inc, range(20), pure=False)
    assert client.gather(others) == list(range(1, 21))
    with pytest.raises(TimeoutError):
        wait([stuck], timeout=0.2)
    assert stuck.status == "pending"  # waiting, not an error
    client.cancel(stuck)


def test_bad_options_fail_the_call(client: Client) -> None:
    with pytest.raises(ValueError, match="only makes sense with workers="):
        client.submit(inc, 1, allow_other_workers=True)
    with pytest.raises(ValueError, match="cannot be -1"):
        client.submit(inc, 1, resources={"GPU": -1})
    with pytest.raises(ValueError, match="needs a number"):
        client.map(inc, [1, 2], resources={"GPU": "one"})
    with pytest.raises(TypeError, match="workers="):
        client.submit(inc, 1, workers=[None])
    assert client.submit(inc, 1).result(timeout=30) == 2  # the connection is fine


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "in-process"])
def test_local_cluster_gives_every_worker_its_resources(processes: bool) -> None:
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=processes,
            resources={"GPU": 1},
            validate=True,
        ) as c,
        Client(c, timeout=30) as client,
    ):
        workers = client.scheduler_info()["workers"]
        assert [w["resources"] for w in workers.values()] == [{"GPU": 1.0}, {"GPU": 1.0}]
        futs = client.map(timed_span, [0.2] * 4, range(4), resources={"GPU": 1}, pure=False)
        spans = client.gather(futs)
        if processes:  # one GPU each: both workers were used, each one task at a time
            assert {pid for pid, _, _ in spans} == set(c.worker_pids)
            for pid in c.worker_pids:
                assert most_at_once([span for span in spans if span[0] == pid]) == 1, spans
        else:  # one process: only two GPUs in all
            assert most_at_once(spans) == 2, spans
        too_big = client.submit(inc, 1, resources={"GPU": 2})
        with pytest.raises(TimeoutError):
            wait([too_big], timeout=0.3)  # no worker has two GPUs


def test_cli_worker_refuses_bad_resources(gpu_cluster: GpuCluster) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "shoal", "worker", gpu_cluster.address, "--resources", "GPU=x"],
        env=_child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert b"--resources" in proc.stderr and b"needs a number" in proc.stderr


def test_dask_annotations_and_compute_options_restrict_graph_tasks(
    client: Client, gpu_cluster: GpuCluster
) -> None:
    import dask

    with dask.annotate(resources={"GPU": 1}):
        gpu_tasks = [dask.delayed(timed_span, pure=False)(0.2, i) for i in range(4)]
    spans = dask.compute(*gpu_tasks)  # the default scheduler: this client
    assert {pid for pid, _, _ in spans} == {gpu_cluster.gpu_pid}
    assert most_at_once(list(spans)) == 1, f"GPU tasks ran at the same time: {spans}"

    pinned = [dask.delayed(pid_after, pure=False)(0.01, i) for i in range(6)]
    futures = client.compute(pinned, workers="0")
    assert set(client.gather(futures)) == {gpu_cluster.plain_pid}
    assert client.get({"a": (inc, 1)}, "a", workers="gpu") == 2
    loose = client.compute(dask.delayed(inc)(5), workers="nowhere", allow_other_workers=True)
    assert loose.result(timeout=30) == 6
    with pytest.raises(ValueError, match="only makes sense with workers="):
        client.compute(dask.delayed(inc)(6), allow_other_workers=True)
