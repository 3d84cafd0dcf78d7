"""Lanes (shoal/lanes): a one-task get goes from the client straight to the worker the
scheduler granted it, with the same outcome as through the scheduler; whatever keeps
the lane from answering sends the task through the scheduler instead."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import msgspec
import pytest
from lane_tasks import (
    big_array,
    big_bytes,
    block_until,
    chatty,
    double,
    fail,
    first_run_hangs,
    nested_get,
    ran_where,
)
from plugin_helpers import SchedulerRecorder

from shoal import Client, LocalCluster
from shoal.client.graph.collections import _lane_spec, _materialize
from shoal.comm.security import Security
from shoal.lanes._client import LaneChannel
from shoal.protocol import messages as m
from shoal.protocol.serialize import loads_value

pytestmark = pytest.mark.timeout(120)


def wait_until(condition: Any, timeout: float = 20, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.01)


def granted(client: Client) -> tuple[str, str]:
    """Compute (a one-task get asks for a lane when it has none) until granted."""

    def asked() -> bool:
        assert dask.delayed(double)(-1).compute(scheduler=client.get) == -2
        return client._lanes.grant is not None

    wait_until(asked, what="a lane")
    grant = client._lanes.grant
    assert grant is not None
    return grant


def lane_get(client: Client, func: Any, *args: Any) -> Any:
    return dask.delayed(func)(*args).compute(scheduler=client.get)


@pytest.fixture
def lanes_client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster, timeout=30) as c:
        yield c


def test_one_task_gets_go_by_lane_with_the_scheduler_told_after(lanes_client: Client) -> None:
    client = lanes_client
    lane, worker = granted(client)
    assert lane.startswith("lane-") and worker in client.scheduler_info()["workers"]
    runs = client._lanes.runs
    pids = client.run(os.getpid)
    for i in range(20):
        pid, value = lane_get(client, ran_where, i)
        assert (pid, value) == (pids[worker], i)  # on the lane's worker, every time
    assert client._lanes.runs == runs + 20
    assert client._lanes.declined == client._lanes.failed == 0
    assert client.has_what()[worker] == []  # nothing held: the value went to the caller only
    # The worker reported each run after answering: in the task stream, on its worker.
    wait_until(
        lambda: sum(r["prefix"] == "ran_where" for r in client.get_task_stream()) >= 20,
        what="the runs in the task stream",
    )
    records = [r for r in client.get_task_stream() if r["prefix"] == "ran_where"]
    assert {r["worker"] for r in records} == {worker}
    assert all(r["status"] == "OK" for r in records)


def test_values_and_errors_are_those_of_the_scheduler_path(lanes_client: Client) -> None:
    client = lanes_client
    granted(client)
    outcomes: dict[bool, list[Any]] = {}
    for lanes in (True, False):
        client._lanes.enabled = lanes
        runs = client._lanes.runs
        got: list[Any] = [lane_get(client, double, 21), lane_get(client, sum, [1, 2, 3])]
        with pytest.raises(ValueError, match="lane task failed on 5") as info:
            lane_get(client, fail, 5)
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "Remote traceback" in notes and "in fail" in notes, notes
        got.append(type(info.value))
        outcomes[lanes] = got
        assert client._lanes.runs == runs + (3 if lanes else 0)
    assert outcomes[True] == outcomes[False] == [42, 6, ValueError]


def test_large_values_come_back_whole(lanes_client: Client) -> None:
    client = lanes_client
    granted(client)
    runs = client._lanes.runs
    data = lane_get(client, big_bytes, 64 << 20)
    assert type(data) is bytes and len(data) == 64 << 20 and data[:512] == bytes(range(256)) * 2
    array = lane_get(client, big_array, 3_000_000)
    assert array.shape == (3_000_000,) and array[-1] == 2_999_999.0 and array.flags.writeable
    assert client._lanes.runs == runs + 2


def test_output_and_warnings_reach_the_caller(
    lanes_client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client = lanes_client
    _, worker = granted(client)
    runs = client._lanes.runs
    with pytest.warns(UserWarning, match="warned by the task of 3"):
        assert lane_get(client, chatty, 3) == 3
    assert client._lanes.runs == runs + 1
    out = capsys.readouterr().out
    assert f"[{worker}] printed by the task of 3" in out


def test_a_busy_worker_declines_and_the_get_goes_through_the_scheduler(
    lanes_client: Client, stop_file: Path
) -> None:
    client = lanes_client
    _, worker = granted(client)
    started = stop_file.with_name("started")
    blocker = client.submit(block_until, str(started), str(stop_file), workers=[worker])
    wait_until(started.exists, what="the blocker to run")
    declined = client._lanes.declined
    pids = client.run(os.getpid)
    pid, value = lane_get(client, ran_where, "x")
    assert value == "x" and pid != pids[worker]  # the other worker, through the scheduler
    assert client._lanes.declined == declined + 1
    stop_file.touch()
    assert blocker.result(timeout=30) == "released"


def test_a_long_run_by_lane_counts_as_a_busy_thread(lanes_client: Client, stop_file: Path) -> None:
    """While a lane's task runs long on its worker, the scheduler sends that worker no
    queued work: it counts the thread busy (LaneBusy), as a task of its own."""
    client = lanes_client
    _, worker = granted(client)
    pids = client.run(os.getpid)
    started = stop_file.with_name("started")
    result: list[Any] = []
    caller = threading.Thread(
        target=lambda: result.append(lane_get(client, block_until, str(started), str(stop_file)))
    )
    caller.start()
    try:
        wait_until(started.exists, what="the lane run to start")
        assert int(started.read_text()) == pids[worker]
        time.sleep(0.3)  # past the worker's BUSY_AFTER: announced
        futures = client.map(ran_where, range(8), pure=False)
        ran_on = {pid for pid, _ in client.gather(futures)}
        assert ran_on == {pids[w] for w in pids if w != worker}
    finally:
        stop_file.touch()
        caller.join(30)
    assert result == ["released"] and client._lanes.runs >= 1


def test_a_task_of_the_lane_may_compute_through_its_worker_client(lanes_client: Client) -> None:
    client = lanes_client
    granted(client)
    runs = client._lanes.runs
    assert lane_get(client, nested_get, 4) == 9
    assert client._lanes.runs == runs + 1


def test_gets_from_many_threads_all_get_their_own_values(lanes_client: Client) -> None:
    client = lanes_client
    granted(client)
    before = client._lanes.runs
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(15):
                assert lane_get(client, double, n * 100 + i) == 2 * (n * 100 + i)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert client._lanes.runs > before  # some went by lane, the others by the scheduler


def test_graphs_a_lane_does_not_take_go_through_the_scheduler(lanes_client: Client) -> None:
    client = lanes_client
    _, worker = granted(client)
    runs = client._lanes.runs
    assert dask.delayed(double)(3).compute(scheduler=client.get, retries=2) == 6
    with dask.annotate(workers=[worker]), dask.config.set(scheduler=client.get):
        assert dask.delayed(double)(4).compute() == 8
    # (graphs of several tasks: test_lane_graphs.py)
    future = client.submit(double, 5)
    assert future.result() == 10
    assert client._lanes.runs == runs
    with dask.config.set({"shoal.client.lanes": False}), Client(client.cluster, timeout=30) as off:
        assert lane_get(off, double, 6) == 12
        assert lane_get(off, double, 7) == 14
        assert off._lanes.grant is None and off._lanes.runs == 0


def test_a_worker_declines_runs_outside_an_open_lane(lanes_client: Client) -> None:
    client = lanes_client
    lane, worker = granted(client)
    assert client.security is not None
    spec, functions = _spec(client, double, 5)
    channel = LaneChannel(worker, client.security, "test", 10)
    try:
        for run, reason in (
            (m.LaneRun(1, "lane-unknown", spec, functions), "is not open"),
            (m.LaneRun(2, lane, msgspec.structs.replace(spec, deps=["x"]), {}), "no dependencies"),
            (m.LaneRun(3, lane, msgspec.structs.replace(spec, retries=1), {}), "no dependencies"),
        ):
            answer = channel.exchange(run, lambda: False)
            assert answer is not None
            reply, _ = answer
            assert reply.status == "declined" and reason in reply.reason, reply
        answer = channel.exchange(m.LaneRun(4, lane, spec, functions), lambda: False)
        assert answer is not None
        reply, buffers = answer
        assert reply.status == "finished" and loads_value(reply.payloads[0], buffers) == 10
    finally:
        channel.close()


def _spec(client: Client, func: Any, *args: Any) -> tuple[m.TaskSpec, dict[str, bytes]]:
    """A lane run's task spec for ``func(*args)``, and the function table it needs."""
    tasks, by_type, _ = _materialize(dask.delayed(func)(*args).__dask_graph__())
    spec = _lane_spec(client, tasks, by_type, None)
    assert spec is not None
    table = client._functions.bytes
    return spec, {fid: table[fid] for fid in (spec.func, *spec.funcs)}


def test_scheduler_plugins_that_watch_transitions_close_the_lanes(
    lanes_client: Client, tmp_path: Path
) -> None:
    client = lanes_client
    granted(client)
    client.register_plugin(SchedulerRecorder(str(tmp_path / "closed")))
    try:
        wait_until(lambda: client._lanes.grant is None, what="the lane to close")
        runs = client._lanes.runs
        for i in range(3):
            assert lane_get(client, double, i) == 2 * i
        time.sleep(0.2)
        assert lane_get(client, double, 10) == 20
        assert client._lanes.runs == runs and client._lanes.grant is None  # none granted
    finally:
        client.unregister_scheduler_plugin(SchedulerRecorder.name)
    granted(client)  # lanes again once no plugin watches


def test_the_lane_worker_killed_mid_run_the_get_goes_through_the_scheduler(
    tmp_path: Path,
) -> None:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, timeout=60, validate=True) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        _, worker = granted(client)
        pid = client.run(os.getpid)[worker]
        marker, started = tmp_path / "marker", tmp_path / "started"
        result: list[Any] = []
        caller = threading.Thread(
            target=lambda: result.append(
                lane_get(client, first_run_hangs, str(marker), str(started))
            )
        )
        caller.start()
        wait_until(started.exists, what="the lane run to start")
        assert int(started.read_text()) == pid  # it runs on the lane's worker
        os.kill(pid, signal.SIGKILL)
        caller.join(60)
        assert result == [7]  # run again, through the scheduler, on the worker left
        assert client._lanes.failed == 1


def test_lanes_over_tls() -> None:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, security=Security.temporary(), validate=True
        ) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        _, worker = granted(client)
        assert worker.startswith("tls://")
        runs = client._lanes.runs
        assert lane_get(client, double, 8) == 16
        assert client._lanes.runs == runs + 1
