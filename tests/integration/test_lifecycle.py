"""Starting and stopping: LocalCluster, the CLI, killed workers, closing clients."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from tasks import wait_for_file

from shoal import CancelledError, Client, LocalCluster

pytestmark = pytest.mark.timeout(60)


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def make_list(n):
    return list(range(n))


def getpid(_):
    return os.getpid()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def gone(pid: int) -> bool:
    """The process has exited and been reaped (a zombie is not gone)."""
    return not psutil.pid_exists(pid)


def read_scheduler_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return str(json.loads(path.read_text())["address"])
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        assert proc.poll() is None, f"the scheduler exited with code {proc.returncode}"
        assert time.monotonic() < deadline, f"no scheduler file at {path} after {timeout}s"
        time.sleep(0.02)


def test_local_cluster_close_leaves_no_process() -> None:
    before = children()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1)
    try:
        started = children() - before
        assert len(cluster.worker_pids) == 2
        assert set(cluster.worker_pids) <= started
        assert len(started) >= 3  # a scheduler and two workers
        with Client(cluster) as client:
            pids = set(client.gather(client.map(getpid, range(20), pure=False)))
            assert pids <= set(cluster.worker_pids)
    finally:
        cluster.close()
    assert cluster.status == "closed"
    assert children() - before == set()
    for pid in started:
        assert gone(pid), f"process {pid} of the cluster is still there"
    cluster.close()  # a second close is harmless


def test_local_cluster_in_process_starts_no_process() -> None:
    before = children()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster:
        assert children() == before
        with Client(cluster) as client:
            assert client.submit(add, 1, 2).result(timeout=30) == 3
            assert len(client.scheduler_info()["workers"]) == 2
    assert cluster.status == "closed"


def test_sigkilled_idle_worker_is_removed() -> None:
    # No nanny: it would start the worker again (tests/integration/test_nanny.py)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, nanny=False) as cluster,
        Client(cluster) as client,
    ):
        assert client.submit(inc, 1).result(timeout=30) == 2
        workers = client.scheduler_info()["workers"]
        assert len(workers) == 2
        by_name = {w["name"]: addr for addr, w in workers.items()}
        victim_pid = cluster.worker_pids[0]
        victim = by_name["0"]  # LocalCluster names its workers by index
        survivor = by_name["1"]
        os.kill(victim_pid, signal.SIGKILL)
        start = time.monotonic()
        removed = wait_until(lambda: victim not in client.scheduler_info()["workers"], 5)
        assert removed, f"{victim} still listed {time.monotonic() - start:.1f}s after SIGKILL"
        assert list(client.scheduler_info()["workers"]) == [survivor]
        # the survivor takes all the work
        futs = client.map(inc, range(20))
        assert client.gather(futs) == list(range(1, 21))
        assert client.submit(getpid, 0, pure=False).result(timeout=30) == cluster.worker_pids[1]


def test_results_of_a_killed_worker_are_recomputed() -> None:
    # Results held by a worker that dies (lists too large to travel with the completion
    # notice: over 64 KiB pickled) are recomputed on the survivor when asked for, even
    # when asked for at once.
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        futs = client.map(make_list, range(30000, 30020))
        assert [len(x) for x in client.gather(futs)] == list(range(30000, 30020))
        workers = client.scheduler_info()["workers"]
        victim = {w["name"]: addr for addr, w in workers.items()}["0"]
        assert workers[victim]["nbytes"] > 0, "the victim holds no results"
        os.kill(cluster.worker_pids[0], signal.SIGKILL)
        values = [f.result(timeout=10) for f in futs]
        assert [len(v) for v in values] == list(range(30000, 30020))
        # The survivor's recomputation need not wait for the scheduler to see the dead
        # worker's connection close (a failed fetch reports the data missing): on a
        # loaded machine the close may be handled just after. It must be handled.
        deadline = time.monotonic() + 10
        while victim in client.scheduler_info()["workers"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert victim not in client.scheduler_info()["workers"]


@pytest.mark.timeout(60)
def test_task_submitted_before_any_worker_runs_on_the_first_to_join(
    tmp_path: Path, spawn: Callable[..., Any]
) -> None:
    # The scheduler sends the queued task with its Welcome, in the same frame.
    sched_file = tmp_path / "scheduler.json"
    scheduler = spawn("scheduler", "--port", "0", "--scheduler-file", str(sched_file), "--quiet")
    address = read_scheduler_file(sched_file, scheduler)
    with Client(address, timeout=30) as client:
        fut = client.submit(inc, 1)
        time.sleep(0.2)
        worker = spawn("worker", address, "--name", "late")
        assert fut.result(timeout=20) == 2
        worker.terminate()
        worker.wait(15)
    scheduler.terminate()
    scheduler.wait(15)


def test_client_without_address_owns_a_local_cluster() -> None:
    before = children()
    with Client() as client:
        cluster = client.cluster
        assert isinstance(cluster, LocalCluster)
        assert cluster.status == "running"
        assert client.scheduler_address == cluster.scheduler_address
        started = children() - before
        assert set(cluster.worker_pids) <= started
        assert client.submit(add, 2, 3).result(timeout=30) == 5
    assert client.status == "closed"
    assert cluster.status == "closed"
    assert children() - before == set()
    for pid in started:
        assert gone(pid)


def test_client_close_releases_every_key(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as observer:
        c1 = Client(inproc_cluster)
        try:
            futs = c1.map(inc, range(100))
            total = c1.submit(sum, futs)
            scattered = c1.scatter([10, 20, 30])
            failed = c1.submit(int, "not a number")
            assert total.result(timeout=30) == 5050
            assert isinstance(failed.exception(timeout=30), ValueError)
            assert observer.scheduler_info()["tasks"] >= 100 + 1 + 3 + 1
        finally:
            c1.close()
        # the futures are still referenced here: close() itself must release their keys
        assert futs and scattered and total
        assert wait_until(lambda: observer.scheduler_info()["tasks"] == 0, 5), (
            f"{observer.scheduler_info()['tasks']} tasks left after the client closed"
        )
        assert c1.status == "closed"


def slow(x):
    time.sleep(x)
    return x


def test_client_close_releases_running_work(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as observer:
        with Client(inproc_cluster) as c1:
            running = [c1.submit(slow, 0.5, pure=False) for _ in range(4)]
            dependents = [c1.submit(inc, f) for f in running]
            time.sleep(0.1)
            assert observer.scheduler_info()["tasks"] == 8
        assert running and dependents
        assert wait_until(lambda: observer.scheduler_info()["tasks"] == 0, 5)
        # the workers are free again
        assert observer.submit(inc, 1).result(timeout=30) == 2


def test_key_shared_by_two_clients_outlives_one(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as c1:
        a = c1.submit(slow, 0.3)
        with Client(inproc_cluster) as c2:
            b = c2.submit(slow, 0.3)
            assert a.key == b.key
        assert a.result(timeout=30) == 0.3
        assert c1.submit(inc, a).result(timeout=30) == 1.3


def test_client_close_releases_keys_on_process_cluster(cluster: LocalCluster) -> None:
    with Client(cluster) as observer:
        baseline = observer.scheduler_info()["tasks"]
        with Client(cluster) as c1:
            futs = c1.map(inc, range(50))
            assert c1.gather(futs) == list(range(1, 51))
            assert observer.scheduler_info()["tasks"] >= baseline + 50
        assert wait_until(lambda: observer.scheduler_info()["tasks"] == baseline, 5)
        del futs


def test_cli_scheduler_and_workers(tmp_path: Path, spawn: Callable[..., Any]) -> None:
    sched_file = tmp_path / "scheduler.json"
    scheduler = spawn(
        "scheduler",
        "--port",
        "0",
        "--scheduler-file",
        str(sched_file),
        stdout=subprocess.PIPE,
    )
    address = read_scheduler_file(sched_file, scheduler)
    assert address.startswith("tcp://127.0.0.1:")
    assert not address.endswith(":0")
    worker_a = spawn(
        "worker", "--scheduler-file", str(sched_file), "--nthreads", "1", "--name", "a"
    )
    worker_b = spawn("worker", address, "--nthreads", "1", "--name", "b")
    procs = {"scheduler": scheduler, "worker a": worker_a, "worker b": worker_b}

    with Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=30)
        workers = client.scheduler_info()["workers"]
        assert sorted(w["name"] for w in workers.values()) == ["a", "b"]
        assert all(w["nthreads"] == 1 for w in workers.values())
        futs = client.map(inc, range(200))
        total = client.submit(sum, futs)
        assert total.result(timeout=30) == sum(range(1, 201))
        pids = set(client.gather(client.map(getpid, range(20), pure=False)))
        assert pids <= {worker_a.pid, worker_b.pid}

    for p in (worker_a, worker_b, scheduler):
        p.send_signal(signal.SIGTERM)
    for name, p in procs.items():
        try:
            code = p.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} (pid {p.pid}) did not exit within 15s of SIGTERM")
        assert code in (0, -signal.SIGTERM), f"{name} exited with code {code}"
    assert scheduler.stdout is not None
    printed = scheduler.stdout.read().decode().split()
    assert printed == [address]


def test_scheduler_killed(tmp_path: Path, spawn: Callable[..., Any]) -> None:
    """A SIGKILLed scheduler: the client's pending futures are cancelled and the workers
    shut themselves down."""
    sched_file = tmp_path / "scheduler.json"
    scheduler = spawn("scheduler", "--port", "0", "--scheduler-file", str(sched_file), "--quiet")
    address = read_scheduler_file(sched_file, scheduler)
    worker = spawn("worker", address, "--name", "w")
    client = Client(address, timeout=30)
    try:
        client.wait_for_workers(1, timeout=30)
        done = client.submit(inc, 1)
        assert done.result(timeout=30) == 2
        pending = client.submit(wait_for_file, str(tmp_path / "never"), 3.0, pure=False)
        time.sleep(0.2)
        scheduler.kill()
        scheduler.wait(10)
        with pytest.raises(CancelledError) as info:
            pending.result(timeout=10)
        assert pending.status == "cancelled"
        assert wait_until(lambda: client.status == "closed", 5)
        with pytest.raises(RuntimeError, match="closed"):
            client.submit(inc, 2)
        try:  # the worker finishes its running task (at most 3s), then exits
            code = worker.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker did not exit after losing its scheduler")
        assert code == 0
        # the error says why the future was cancelled
        assert "lost the scheduler" in str(info.value)
    finally:
        client.close()  # closing a client that lost its scheduler still stops its thread


OWNER = """
import json, time
from shoal import LocalCluster
cluster = LocalCluster(n_workers=2, threads_per_worker=1)
print(json.dumps([p.pid for p in cluster._procs] + cluster.worker_pids), flush=True)
time.sleep(60)
"""


def test_local_cluster_processes_exit_with_their_owner() -> None:
    """The owner of a LocalCluster is SIGKILLed (no atexit, no close): the scheduler
    notices its owner is gone and the workers and their nannies follow."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    pids: list[int] = []
    try:
        assert owner.stdout is not None
        pids = json.loads(owner.stdout.readline())
        assert len(pids) == 5  # a scheduler, two nannies, two workers
        owner.kill()
        owner.wait(10)

        def alive() -> list[int]:
            out = []
            for pid in pids:
                try:
                    if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                        out.append(pid)
                except psutil.NoSuchProcess:
                    pass
            return out

        assert wait_until(lambda: not alive(), 10), f"still running: {alive()}"
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.wait(10)
        owner.stdout.close()  # type: ignore[union-attr]
        for pid in pids:  # orphans are not our children: clean up by pid if need be
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def closed_port() -> int:
    """A port the OS just handed out and nobody listens on any more."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("nanny", ["--nanny", "--no-nanny"])
def test_worker_with_no_scheduler_listening_ends_with_one_clear_line(
    spawn: Callable[..., Any], tmp_path: Path, nanny: str
) -> None:
    address = f"tcp://127.0.0.1:{closed_port()}"
    p = spawn(
        "worker",
        address,
        nanny,
        "--timeout",
        "1",
        "--local-directory",
        str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = p.communicate(timeout=30)
    assert p.returncode == 1
    [line] = err.decode().strip().splitlines()  # one line, no traceback
    expected = f"Error: no scheduler at {address} within 1s (--timeout): could not connect to "
    assert line.startswith(f"{expected}{address}: ") and "refused" in line, line
    assert out == b""
    assert list(tmp_path.iterdir()) == []  # the nanny's directory is gone too


def big(i: int) -> bytes:
    return bytes(8_000_000) + bytes([i])


UNRETRIEVED = ("never retrieved", "Traceback")


@pytest.mark.parametrize("ending", ["normal-close", "scheduler-killed"])
def test_closing_logs_no_unretrieved_future_exceptions(
    tmp_path: Path, spawn: Callable[..., Any], caplog: pytest.LogCaptureFixture, ending: str
) -> None:
    sched_file = tmp_path / "s.json"
    pipes = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
    sched = spawn("scheduler", "--port", "0", "--scheduler-file", str(sched_file), **pipes)
    address = read_scheduler_file(sched_file, sched)
    workers = [
        spawn("worker", address, "--log-level", "info", "--name", f"w{i}", **pipes)
        for i in range(2)
    ]
    with caplog.at_level(logging.DEBUG):
        client = Client(address, timeout=20)
        try:
            client.wait_for_workers(2, timeout=20)
            futs = client.map(big, range(6))
            # results move between the workers and to this client (writes that pause)
            assert client.submit(lambda xs: sum(len(x) for x in xs), futs).result(30) == 48_000_006
            assert len(client.gather(futs)) == 6
            if ending == "scheduler-killed":
                sched.send_signal(signal.SIGKILL)
                for w in workers:  # they notice, and exit
                    assert w.wait(20) == 0
        finally:
            client.close()
        for p in [*workers, sched]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
    for p in [*workers, sched]:
        p.wait(20)
        err = p.stderr.read().decode()
        assert not [x for x in UNRETRIEVED if x in err], err[-3000:]
    messages = [r.getMessage() for r in caplog.records]
    assert not [msg for msg in messages if any(x in msg for x in UNRETRIEVED)], messages
