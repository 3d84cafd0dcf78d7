"""A task run on the thread of its last input, right after it (shoal/server/run_next.py):
the same results, errors and thread accounting as when the loop hands it over, on real
worker processes. The tasks are unrestricted and submitted in one graph, so that the
scheduler sends each ahead to the worker computing its input (core/scheduler/ahead.py):
that is when it is offered."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dask import delayed
from recording_scheduler import on_a_loop_thread
from run_next_funcs import (
    counted_failure,
    early_runs,
    executions,
    secede_rejoin,
    slow_step,
    step,
    submit_from_task,
)
from subprocess_env import child_env

from shoal import Client
from shoal.server.scheduler import Scheduler

pytestmark = pytest.mark.timeout(120)


def cluster(spawn: Callable[..., Any], name: str, n: int, **env: str) -> Iterator[Client]:
    with on_a_loop_thread(Scheduler("127.0.0.1", 0), name) as s:
        environ = child_env()
        environ.update(env)
        for i in range(n):
            spawn("worker", s.address, "--name", f"w{i}", "--nthreads", "1", env=environ)
        with Client(s.address, timeout=30) as client:
            client.wait_for_workers(n, timeout=30)
            yield client


@pytest.fixture
def two_workers(spawn: Callable[..., Any]) -> Iterator[Client]:
    """Two workers of one thread each that run tasks early (the default)."""
    yield from cluster(spawn, "run-next", 2)


def chain(client: Client, length: int, tag: str) -> Any:
    """A chain of ``step`` tasks: each waits for the one before alone."""
    future = client.submit(step, 0, key=f"{tag}-0")
    for i in range(1, length):
        future = client.submit(step, future, key=f"{tag}-{i}")
    return future


def totals(client: Client) -> tuple[int, int, int]:
    counts = client.run(early_runs).values()
    return (sum(c[0] for c in counts), sum(c[1] for c in counts), sum(c[2] for c in counts))


def test_chains_give_the_same_results_with_tasks_run_early(two_workers: Client) -> None:
    client = two_workers
    for round_ in range(3):
        assert chain(client, 30, f"chain-{round_}").result(timeout=30) == 30
    ran, delivered, dropped = totals(client)
    assert delivered > 0  # (how many depends on when each ComputeTask comes)
    assert ran == delivered + dropped  # nothing is kept once all is done


def test_turned_off_no_task_runs_early(spawn: Callable[..., Any]) -> None:
    for client in cluster(spawn, "run-next-off", 1, SHOAL_WORKER__RUN_NEXT="False"):
        assert chain(client, 30, "off").result(timeout=30) == 30
        assert totals(client) == (0, 0, 0)


def test_a_failing_task_run_early_errs_once_with_its_own_error(two_workers: Client) -> None:
    client = two_workers
    for i in range(8):
        name = f"fail-{i}"
        first = delayed(slow_step)(i, dask_key_name=f"{name}-first")
        failing = client.compute(delayed(counted_failure)(first, name, dask_key_name=name))
        with pytest.raises(ValueError, match=f"{name} failed on {i + 1}"):
            failing.result(timeout=30)
        assert sum(client.run(executions, name).values()) == 1  # not run again
    assert totals(client)[1] > 0


def test_a_task_run_early_may_secede_and_rejoin(two_workers: Client) -> None:
    client = two_workers
    for i in range(8):
        first = delayed(slow_step)(i, dask_key_name=f"secede-first-{i}")
        second = client.compute(delayed(secede_rejoin)(first, dask_key_name=f"secede-{i}"))
        assert second.result(timeout=30) == (i + 1) * 10
    assert totals(client)[1] > 0


def test_a_task_run_early_may_wait_on_a_task_needing_its_thread(two_workers: Client) -> None:
    client = two_workers
    for i in range(8):
        first = delayed(slow_step)(i, dask_key_name=f"wait-first-{i}")
        second = client.compute(delayed(submit_from_task)(first, dask_key_name=f"wait-{i}"))
        assert second.result(timeout=30) == (i + 2) * 100
    assert totals(client)[1] > 0
    # every thread is free again: a task per worker still runs
    workers = list(client.scheduler_info()["workers"])
    futures = [client.submit(step, 1, workers=w, pure=False) for w in workers]
    assert client.gather(futures) == [2, 2]


def test_reductions_computed_again_over_the_same_keys_stay_right(two_workers: Client) -> None:
    """Dask's keys repeat from one compute of a graph to the next: an offer made for one
    execution of a key must never be taken by a later one (it once was, and a later
    aggregate ran early on missing inputs, its KeyError delivered as the result)."""
    da = pytest.importorskip("dask.array")
    np = pytest.importorskip("numpy")
    client = two_workers
    x = da.ones((1000, 1000), chunks=250)
    values = np.arange(4000 * 50, dtype=float).reshape(4000, 50)
    tall = da.from_array(values, chunks=(500, 50))
    for _ in range(15):
        assert x.sum().compute(scheduler=client.get) == 1_000_000
        assert np.allclose((tall.T @ tall).compute(scheduler=client.get), values.T @ values)
    assert totals(client)[0] > 0
