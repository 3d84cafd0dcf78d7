"""Client and cluster construction as in Dask: LocalCluster keywords on the Client,
``scheduler_file``, ``Client.sync``, ``cluster.workers``/``.scheduler``/``.scale``, the
reprs, and a normal exit that prints nothing alarming."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from subprocess_env import child_env

from shoal import Client, LocalCluster


def test_client_starts_a_local_cluster_with_dask_keywords() -> None:
    with Client(
        n_workers=2, threads_per_worker=1, processes=False, memory_limit="1GB", timeout=30
    ) as c:
        assert isinstance(c.cluster, LocalCluster)
        assert c.cluster.processes is False
        info = c.scheduler_info()
        assert len(info["workers"]) == 2
        assert {w["nthreads"] for w in info["workers"].values()} == {1}
        assert {w["memory_limit"] for w in info["workers"].values()} == {10**9}
        assert c.submit(sum, [1, 2, 3]).result(timeout=10) == 6
        assert sorted(c.cluster.workers) == ["0", "1"]
        # in process, the scheduler object is reachable, as in Dask
        assert c.cluster.scheduler.address == c.scheduler_address
        c.cluster.scale(3)
        c.wait_for_workers(3, timeout=20)
        assert len(c.cluster.workers) == 3
        cluster = c.cluster
    assert cluster.status == "closed"  # the client's own cluster closes with it


def test_client_rejects_unknown_and_misplaced_cluster_keywords(
    inproc_cluster: LocalCluster,
) -> None:
    with pytest.raises(TypeError, match="n_wokers"):
        Client(n_wokers=2)
    with pytest.raises(TypeError, match="only apply when the Client starts its own cluster"):
        Client(inproc_cluster.scheduler_address, n_workers=2)


def test_client_from_scheduler_file(inproc_cluster: LocalCluster, tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    inproc_cluster.scheduler.write_scheduler_file(path)
    with Client(scheduler_file=str(path), timeout=30) as c:
        assert c.scheduler_address == inproc_cluster.scheduler_address
        assert c.submit(len, "abc").result(timeout=10) == 3
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Client(scheduler_file=str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"id": "x"}))
    with pytest.raises(ValueError, match="names no scheduler address"):
        Client(scheduler_file=str(tmp_path / "bad.json"))


def test_sync_runs_coroutine_functions_on_the_loop(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster, timeout=30) as c:

        async def add(a: int, b: int = 0) -> int:
            return a + b

        assert c.sync(add, 1, b=2) == 3
        assert c.sync(lambda: 5) == 5
        fut = c.submit(pow, 2, 10)
        assert c.sync(c._gather_async, [fut]) == [1024]


def test_a_synchronous_client_used_on_its_own_loop_returns_awaitables(
    inproc_cluster: LocalCluster,
) -> None:
    """Dask's evolving-workflows notebook: ``client.sync(run_all)`` where ``run_all``
    awaits ``client.gather(...)`` and a future of the same synchronous client. Blocking
    there would hang the loop; as in Dask, the client answers with awaitables."""
    with Client(inproc_cluster, timeout=30) as c:

        async def run_all(n: int) -> list[int]:
            length = await c.submit(len, list(range(n)))
            futures = c.map(pow, [2] * length, range(length))
            return await c.gather(futures)

        assert c.asynchronous is False  # from this thread
        assert c.sync(run_all, 4) == [1, 2, 4, 8]
        assert c.gather(c.map(pow, [3, 3], [1, 2])) == [3, 9]  # still synchronous here


def test_reprs_show_workers_threads_memory(inproc_cluster: LocalCluster) -> None:
    with Client(inproc_cluster, timeout=30) as c:
        text = repr(c)
        assert inproc_cluster.scheduler_address in text
        assert "workers=2, threads=2" in text
        limit = inproc_cluster.memory_limit
        assert limit is not None
        html = c._repr_html_()
        assert "<table>" in html and inproc_cluster.scheduler_address in html
        assert "Workers</th><td style='text-align: left'>2<" in html
        link = c.dashboard_link  # the cluster has a token: a one-time login link
        assert link is not None and "/login?" in link and "next=status" in link
        assert "Dashboard" in html and "<a href=" in html and "dashboard=" in text
        assert inproc_cluster.dashboard_link is not None and "dashboard=" in repr(inproc_cluster)
        ctext = repr(inproc_cluster)
        assert "workers=2, threads=2" in ctext and "status=running" in ctext
        assert "Threads</th><td style='text-align: left'>2<" in inproc_cluster._repr_html_()
    assert "status=closed" in repr(c)


def test_processes_cluster_scheduler_is_a_read_only_view_with_worker_pids(
    cluster: LocalCluster,
) -> None:
    """What Dask's resilience notebook reads: ``[w.pid for w in
    cluster.scheduler.workers.values()]``, the pids of the worker processes."""
    view = cluster.scheduler
    assert view.address == cluster.scheduler_address
    assert view.id.startswith("scheduler-")
    workers = view.workers
    assert sorted(w.pid for w in workers.values()) == sorted(cluster.worker_pids)
    assert sorted(w.name for w in workers.values()) == ["0", "1"]
    for address, w in workers.items():
        assert w.address == address and w.nthreads == 1 and w.memory_limit > 0
    assert view.n_workers == 2 and view.total_nthreads == 2
    with pytest.raises(AttributeError, match="read-only"):
        view.workers = {}  # type: ignore[misc]
    assert len(cluster.workers) == 2


def test_in_process_scheduler_lists_its_workers_too(inproc_cluster: LocalCluster) -> None:
    workers = inproc_cluster.scheduler.workers
    assert sorted(w.name for w in workers.values()) == ["0", "1"]
    assert {w.pid for w in workers.values()} == {os.getpid()}


SCRIPT = textwrap.dedent(
    """
    import logging
    logging.basicConfig(level=logging.WARNING)
    from shoal import Client
    c = Client(n_workers=1, threads_per_worker=1, processes={processes})
    print("result", c.submit(sum, [20, 22]).result(timeout=30))
    {ending}
    """
)


@pytest.mark.parametrize("processes", [True, False])
@pytest.mark.parametrize("ending", ["c.close()", "pass  # left to the exit"])
def test_a_normal_exit_is_silent(processes: bool, ending: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(processes=processes, ending=ending)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    assert "result 42" in out.stdout
    assert "lost the scheduler" not in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


SYNC_SCRIPT = textwrap.dedent(
    """
    import logging
    logging.basicConfig(level=logging.WARNING)
    from shoal import Client
    c = Client(processes=False, n_workers=1, threads_per_worker=6)

    async def run_all():
        n = await c.submit(len, [1, 2, 3])
        return await c.gather(c.map(pow, [2] * n, range(n)))

    print("result", c.sync(run_all))

    def from_a_task(n):
        from shoal import get_client, rejoin, secede
        worker_client = get_client()
        futures = worker_client.map(pow, [3] * n, range(n))
        secede()
        out = worker_client.gather(futures)
        rejoin()
        return out

    print("tasks", c.gather(c.map(from_a_task, [2, 3])))
    """
)


def test_an_in_process_cluster_left_to_the_exit_after_client_sync_closes_silently() -> None:
    """Dask's evolving-workflows notebook ends so: the cluster, closed at exit, used to
    close the worker's client and join its threads through an executor that no longer
    takes work then: the worker's client 'lost the scheduler', the scheduler's tasks
    were 'destroyed but pending'."""
    out = subprocess.run(
        [sys.executable, "-c", SYNC_SCRIPT],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    assert "result [1, 2, 4]" in out.stdout and "tasks [[1, 3], [1, 3, 9]]" in out.stdout
    assert "destroyed but it is pending" not in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "lost the scheduler" not in out.stderr
