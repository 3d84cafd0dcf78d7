"""The cluster summary pushed to subscribed clients, and paged worker lists."""

from __future__ import annotations

import time

import pytest

from shoal import Client, LocalCluster
from shoal.server.worker import Worker

pytestmark = pytest.mark.timeout(60)


def inc(x: int) -> int:
    return x + 1


def test_summary_is_pushed_and_a_joining_worker_shows_within_an_interval(
    inproc_cluster: LocalCluster,
) -> None:
    with Client(inproc_cluster) as client:
        client.wait_for_workers(2, timeout=10)
        first = client.cluster_summary()
        assert first["workers"] == 2 and first["nthreads"] == 2
        futures = client.map(inc, range(10))
        assert client.gather(futures) == list(range(1, 11))
        deadline = time.monotonic() + 5
        while client.cluster_summary()["tasks"].get("memory") != 10:
            assert time.monotonic() < deadline, client.cluster_summary()
            time.sleep(0.05)
        summary = client.cluster_summary()
        assert summary["version"] > first["version"]
        assert summary["prefixes"]["inc"]["states"] == {"memory": 10}
        assert summary["prefixes"]["inc"]["duration_count"] == 10

        # a third worker joins: pushed within one interval (0.5 s), with no request
        runner = inproc_cluster._runner
        assert runner is not None

        async def add_worker() -> Worker:
            address = inproc_cluster.scheduler_address
            return await Worker(address, 3, name="late", security=inproc_cluster.security).start()

        late = runner.run_sync(add_worker(), 10)
        try:
            joined = time.monotonic()
            while client.cluster_summary()["workers"] != 3:
                assert time.monotonic() - joined < 1.5, "the join was not pushed in time"
                time.sleep(0.02)
            assert client.cluster_summary()["nthreads"] == 5
        finally:
            runner.run_sync(late.close(), 10)


def test_scheduler_info_pages_the_worker_list(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as client:
        client.wait_for_workers(2, timeout=10)
        full = client.scheduler_info()
        assert full["n_workers"] == 2 and len(full["workers"]) == 2
        first = client.scheduler_info(n_workers=1)
        second = client.scheduler_info(n_workers=1, start=1)
        assert first["n_workers"] == second["n_workers"] == 2
        assert len(first["workers"]) == len(second["workers"]) == 1
        assert {*first["workers"], *second["workers"]} == set(full["workers"])
        assert client.scheduler_info(n_workers=5, start=2)["workers"] == {}


def test_a_client_that_does_not_subscribe_gets_no_pushes(inproc_cluster: LocalCluster) -> None:
    with (
        Client(inproc_cluster, subscribe=False) as quiet,
        Client(inproc_cluster) as loud,
    ):
        scheduler = inproc_cluster._scheduler
        assert quiet.id not in scheduler._subscribers
        assert loud.id in scheduler._subscribers
        assert loud.cluster_summary()["workers"] == 2  # pushed at once on joining
        assert quiet.cluster_summary() == {}  # nothing pushed
        quiet.wait_for_workers(2, timeout=10)  # works by asking instead
        assert quiet.cluster_summary()["workers"] == 2


def test_task_prefixes_count_tasks_per_state(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster) as client:
        futures = client.map(inc, range(20))
        client.gather(futures)
        prefixes = client.task_prefixes()
        assert prefixes["inc"]["states"] == {"memory": 20}
        assert prefixes["inc"]["duration_count"] == 20
        del futures
        deadline = time.monotonic() + 5
        while "inc" in client.task_prefixes():  # all released: the prefix has no live task
            assert time.monotonic() < deadline
            time.sleep(0.05)
