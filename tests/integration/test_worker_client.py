"""Tasks that submit tasks: ``get_client``, ``worker_client``, ``secede``, ``rejoin``.

The core case: a task on a single-threaded worker submits sub-tasks and waits for them
inside ``worker_client``; it secedes meanwhile, so the sub-tasks get the thread and
nothing deadlocks. Task functions live at module level so that worker processes can
import them by name.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

import shoal
from shoal import Client, LocalCluster
from shoal.server import scheduler as scheduler_server


def inc(x: int) -> int:
    return x + 1


def sum_of_incs(n: int) -> int:
    """Submit ``n`` sub-tasks and wait for them without holding a thread."""
    with shoal.worker_client() as client:
        futures = client.map(inc, range(n), key=[f"inc-{os.getpid()}-{n}-{i}" for i in range(n)])
        return sum(client.gather(futures))


def fan_out(n: int, tag: int) -> int:
    with shoal.worker_client() as client:
        futures = [client.submit(inc, i, key=f"sub-{tag}-{i}") for i in range(n)]
        return sum(f.result(timeout=60) for f in futures)


def secede_then_rejoin(x: int) -> tuple[int, str, str]:
    before = threading.current_thread().name
    shoal.secede()
    client = shoal.get_client()
    value = client.submit(inc, x, key=f"inner-{x}").result(timeout=30)
    shoal.rejoin()
    return value, before, threading.current_thread().name  # the same thread throughout


def client_identity(_: int) -> tuple[int, int]:
    return os.getpid(), id(shoal.get_client())


def sleepy(x: int) -> int:
    time.sleep(0.05)
    return x


@pytest.mark.timeout(60)
def test_waiting_on_subtasks_inside_worker_client_on_one_thread():
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        assert client.submit(sum_of_incs, 10).result(timeout=45) == sum(range(1, 11))


@pytest.mark.timeout(90)
def test_twenty_fan_outs_at_once_on_two_single_threaded_workers():
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        futures = [client.submit(fan_out, 5, i, key=f"fan-{i}") for i in range(20)]
        assert client.gather(futures) == [sum(range(1, 6))] * 20


@pytest.mark.timeout(60)
def test_secede_then_rejoin_inside_a_task():
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        value, before, after = client.submit(secede_then_rejoin, 41).result(timeout=45)
        assert value == 42 and before == after
        # the worker still runs tasks normally afterwards, on its one counted thread
        assert client.gather(client.map(sleepy, range(4))) == list(range(4))


@pytest.mark.timeout(60)
def test_get_client_is_one_client_per_worker_reused_across_tasks():
    with LocalCluster(n_workers=1, threads_per_worker=2) as cluster, Client(cluster) as client:
        futures = client.map(client_identity, range(8))
        assert len(set(client.gather(futures))) == 1  # same process, same client object


@pytest.mark.timeout(60)
def test_the_client_inside_a_task_does_not_subscribe(monkeypatch: pytest.MonkeyPatch):
    seen: dict[str, bool] = {}
    add_client = scheduler_server.Scheduler._add_client

    def recording(self: Any, conn: Any, hello: Any) -> None:
        seen[hello.name] = hello.subscribe
        add_client(self, conn, hello)

    monkeypatch.setattr(scheduler_server.Scheduler, "_add_client", recording)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False) as cluster,
        Client(cluster, name="outside") as client,
    ):
        assert client.submit(sum_of_incs, 3).result(timeout=30) == 6
    worker_side = {name: sub for name, sub in seen.items() if name.startswith("worker-")}
    assert seen["outside"] is True
    assert len(worker_side) == 1 and list(worker_side.values()) == [False]


@pytest.mark.timeout(30)
def test_outside_a_task():
    with pytest.raises(ValueError, match="inside a task"):
        shoal.secede()
    with pytest.raises(ValueError, match="inside a task"):
        shoal.rejoin()
    with pytest.raises(ValueError, match="inside a task"), shoal.worker_client():
        pass
    with LocalCluster(n_workers=1, threads_per_worker=1) as cluster:
        with Client(cluster) as client:
            assert shoal.get_client() is client  # the default client, as Dask
        with Client(cluster, set_as_default=False), pytest.raises(ValueError, match="default"):
            shoal.get_client()


def wait_on_slow(started: str) -> int:
    with shoal.worker_client() as client:
        open(started, "w").close()
        # 3 s: a running task cannot be interrupted, and the worker waits 5 s per thread
        client.submit(time.sleep, 3, key="slow-sleep").result(timeout=60)
        client.submit(time.sleep, 3, key="never-reached").result(timeout=60)
        return 1


@pytest.mark.timeout(60)
def test_closing_the_cluster_while_a_task_waits_inside_worker_client(tmp_path: Any):
    """The worker closes its client first, so the waiting task ends; no thread, process
    or socket is left behind (the leak check runs after every test)."""
    started = tmp_path / "started"
    t0 = time.monotonic()
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False) as cluster,
        Client(cluster) as client,
    ):
        parent = client.submit(wait_on_slow, str(started))
        while not started.exists():
            time.sleep(0.02)
        assert parent.status == "pending"
    assert time.monotonic() - t0 < 25  # did not wait for the parent's 60 s timeout
