"""Small graphs by lane (shoal/lanes): a ``get`` of a small graph goes whole to the
lane's worker, which runs it as Dask's synchronous scheduler would, when the prefixes'
durations say it is short; the values and errors are those of the scheduler's path,
and whatever keeps the lane from answering (not known to be short, a run that goes on
too long or holds too much, a killed worker) sends the graph through the scheduler."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
from lane_tasks import block, chatty, double, hangs_first, maybe_fail, nap, ran_where

from shoal import Client, LocalCluster
from shoal.client.graph.collections import _materialize
from shoal.client.graph.lane_graph import lane_graph
from shoal.lanes._client import LaneChannel
from shoal.protocol import messages as m
from shoal.protocol.serialize import loads_value

pytestmark = pytest.mark.timeout(120)

delayed = dask.delayed


def wait_until(condition: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)


def by_lane(client: Client, make: Callable[[], Any], check: Callable[[Any], None]) -> Any:
    """Compute ``make()`` until a compute goes whole by lane (the first ones go through
    the scheduler, which measures its prefixes and shares their durations with the
    lane's worker); every value passes ``check``. The value by lane."""
    out: list[Any] = []

    def went() -> bool:
        before = client._lanes.graph_runs
        value = make().compute(scheduler=client.get)
        check(value)
        out[:] = [value]
        return client._lanes.graph_runs == before + 1

    wait_until(went, what="a compute by lane")
    return out[0]


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster, timeout=30) as c:
        yield c


def test_small_graphs_go_whole_by_lane_with_the_sync_schedulers_values(client: Client) -> None:
    rng = da.random.default_rng(1)
    tall = rng.random((400, 20), chunks=(100, 20))
    expected = (tall.T @ tall).compute(scheduler="sync")
    value = by_lane(
        client, lambda: tall.T @ tall, lambda v: np.testing.assert_allclose(v, expected)
    )
    assert value.shape == (20, 20) and value.flags.writeable
    assert by_lane(client, lambda: da.ones((100, 100), chunks=25).sum(), lambda v: None) == 10_000
    # Several keys asked for at once, one of them an alias of another.
    a, b = delayed(double)(1), delayed(double)(2)
    total = delayed(sum)([a, b])
    both = lambda: delayed(list)([total, a])  # noqa: E731
    assert by_lane(client, both, lambda v: None) == [6, 2]
    runs = client._lanes.graph_runs
    assert dask.compute(total, a, b, scheduler=client.get) == (6, 2, 4)
    assert client._lanes.graph_runs == runs + 1  # (a tuple of three keys, one graph)
    assert client.has_what() == {w: [] for w in client.has_what()}  # nothing kept


def test_a_graph_by_lane_runs_on_the_lanes_worker_and_is_reported_after(client: Client) -> None:
    grant: list[str] = []

    def on_lane_worker(value: Any) -> None:
        if client._lanes.grant is not None:
            grant[:] = [client._lanes.grant[1]]

    pids = client.run(os.getpid)
    graph = lambda: delayed(list)([delayed(ran_where)(i) for i in range(3)])  # noqa: E731
    value = by_lane(client, graph, on_lane_worker)
    (worker,) = grant
    assert [pid for pid, _ in value] == [pids[worker]] * 3 and [x for _, x in value] == [0, 1, 2]

    def reported() -> bool:
        stream = client.get_task_stream()
        return sum(r["prefix"] == "ran_where" and r["worker"] == worker for r in stream) >= 3

    wait_until(reported, what="the graph's tasks in the task stream")


def test_errors_are_those_of_the_scheduler_path(client: Client) -> None:
    def graph(fail: bool) -> Any:
        return delayed(sum)([delayed(maybe_fail)(1, False), delayed(maybe_fail)(2, fail)])

    by_lane(client, lambda: graph(False), lambda v: None)  # "maybe_fail" and "sum" measured
    errors: dict[bool, BaseException] = {}
    for lanes in (True, False):
        client._lanes.enabled = lanes
        runs = client._lanes.graph_runs
        with pytest.raises(ValueError, match="graph task failed on 2") as info:
            graph(True).compute(scheduler=client.get)
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "Remote traceback" in notes and "in maybe_fail" in notes, notes
        errors[lanes] = info.value
        assert client._lanes.graph_runs == runs + lanes
    client._lanes.enabled = True
    assert type(errors[True]) is type(errors[False]) and str(errors[True]) == str(errors[False])


def test_output_and_warnings_of_a_graph_reach_the_caller(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = lambda: delayed(sum)([delayed(chatty)(3), delayed(chatty)(4)])  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_lane(client, graph, lambda v: None)
    capsys.readouterr()
    worker = client._lanes.grant[1] if client._lanes.grant else ""
    runs = client._lanes.graph_runs
    with pytest.warns(UserWarning) as record:
        assert graph().compute(scheduler=client.get) == 7
    assert sorted(str(w.message) for w in record) == [
        "warned by the task of 3",
        "warned by the task of 4",
    ]
    assert client._lanes.graph_runs == runs + 1
    out = capsys.readouterr().out
    assert f"[{worker}] printed by the task of 3" in out and "printed by the task of 4" in out


def test_graphs_a_lane_does_not_take_go_through_the_scheduler(client: Client) -> None:
    graph = lambda: delayed(sum)([delayed(double)(1), delayed(double)(2)])  # noqa: E731
    by_lane(client, graph, lambda v: None)  # such a graph goes by lane
    runs, declined = client._lanes.graph_runs, client._lanes.declined
    assert graph().compute(scheduler=client.get, retries=1) == 6
    with dask.annotate(workers=list(client.has_what()), allow_other_workers=True):
        annotated = graph()
    assert annotated.compute(scheduler=client.get) == 6
    future = client.submit(double, 5)
    assert delayed(sum)([future, delayed(double)(2)]).compute(scheduler=client.get) == 14
    many = delayed(sum)([delayed(double)(i) for i in range(70)])  # 71 tasks
    assert many.compute(scheduler=client.get) == 2 * sum(range(70))
    data = np.arange(100_000.0)  # a large constant: kept on the workers between computes
    assert delayed(np.sum)(delayed(np.negative)(data)).compute(scheduler=client.get) < 0
    assert (client._lanes.graph_runs, client._lanes.declined) == (runs, declined)  # none tried


def test_a_graph_not_known_to_be_short_goes_through_the_scheduler(client: Client) -> None:
    slow = lambda: delayed(sum)([delayed(nap)(1, 0.015), delayed(nap)(2, 0.015)])  # noqa: E731
    # Its first compute: "nap" was never measured. The next ones: 2 x 15 ms > 20 ms.
    for _ in range(4):
        assert slow().compute(scheduler=client.get) == 3
        time.sleep(0.3)  # (the scheduler shares durations every 0.5 s)
    runs, declined = client._lanes.graph_runs, client._lanes.declined
    for _ in range(3):
        assert slow().compute(scheduler=client.get) == 3
    # Offered each time (a decline on expectation is not remembered), declined each time.
    assert (client._lanes.graph_runs, client._lanes.declined) == (runs, declined + 3)
    assert client._lanes.graph_runs == 0


def test_a_graph_that_runs_too_long_stops_and_goes_through_the_scheduler(client: Client) -> None:
    def graph(seconds: float) -> Any:
        return delayed(sum)([delayed(nap)(i, seconds) for i in range(3)])

    by_lane(client, lambda: graph(0.0), lambda v: None)  # "nap" measured short
    runs, declined = client._lanes.graph_runs, client._lanes.declined
    stopped = sum(client.run(lambda dask_worker: dask_worker.lanes.graphs_stopped).values())
    assert graph(0.07).compute(scheduler=client.get) == 3  # stops after its second task
    assert (client._lanes.graph_runs, client._lanes.declined) == (runs, declined + 1)
    assert sum(client.run(lambda dask_worker: dask_worker.lanes.graphs_stopped).values()) == (
        stopped + 1
    )
    # Graphs of its kind are not offered again for a while: straight to the scheduler.
    assert graph(0.0).compute(scheduler=client.get) == 3
    assert (client._lanes.graph_runs, client._lanes.declined) == (runs, declined + 1)


def test_the_lane_worker_killed_mid_graph_the_get_goes_through_the_scheduler(
    tmp_path: Path,
) -> None:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, timeout=60, validate=True) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        warm, marker, started = tmp_path / "warm", tmp_path / "marker", tmp_path / "started"
        warm.touch()

        def graph(path: Path) -> Any:
            return delayed(double)(delayed(hangs_first)(7, str(path), str(tmp_path / "unused")))

        by_lane(client, lambda: graph(warm), lambda v: None)  # measured short
        worker = client._lanes.grant[1] if client._lanes.grant else ""
        pid = client.run(os.getpid)[worker]
        result: list[Any] = []
        hanging = delayed(double)(delayed(hangs_first)(7, str(marker), str(started)))
        caller = threading.Thread(
            target=lambda: result.append(hanging.compute(scheduler=client.get))
        )
        caller.start()
        wait_until(started.exists, what="the graph to start by lane")
        assert int(started.read_text()) == pid
        os.kill(pid, signal.SIGKILL)
        caller.join(60)
        assert result == [14]  # run again, through the scheduler, on the worker left
        assert client._lanes.failed == 1


def test_a_graph_holding_more_than_its_bytes_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOAL_WORKER__LANE_GRAPHS__MAX_BYTES", "10KiB")
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, timeout=60) as cluster,
        Client(cluster, timeout=30) as client,
    ):

        def joined(n: int) -> Any:  # its three blocks are held at once
            return delayed(np.concatenate)([delayed(block)(n) for _ in range(3)])

        by_lane(client, lambda: joined(10), lambda v: None)  # 3 x 80 B: within
        (limits,) = client.run(lambda dask_worker: dask_worker.lanes.graph_limits).values()
        assert limits[2] == 10 * 1024
        runs, declined = client._lanes.graph_runs, client._lanes.declined
        value = joined(1000).compute(scheduler=client.get)  # 3 x 8 KB: stops
        assert value.shape == (3000,) and value.sum() == 3000.0
        assert (client._lanes.graph_runs, client._lanes.declined) == (runs, declined + 1)


def test_a_worker_declines_graphs_out_of_order_or_outside_an_open_lane(client: Client) -> None:
    graph = lambda: delayed(sum)([delayed(double)(1), delayed(double)(2)])  # noqa: E731
    by_lane(client, graph, lambda v: None)
    assert client._lanes.grant is not None and client.security is not None
    lane, worker = client._lanes.grant
    total = graph()
    tasks, by_type, templates = _materialize(total.__dask_graph__())
    encoded = lane_graph(client, tasks, by_type, templates, [total.key], None)
    assert encoded is not None and len(encoded.tasks) == 3
    table = client._functions.bytes
    functions = {fid: table[fid] for spec in encoded.tasks for fid in (spec.func, *spec.funcs)}
    channel = LaneChannel(worker, client.security, "test", 10)
    backwards = encoded.tasks[::-1]
    try:
        for run, reason in (
            (m.LaneRunGraph(1, "lane-unknown", encoded.tasks, encoded.keys), "is not open"),
            (m.LaneRunGraph(2, lane, backwards, encoded.keys), "which does not run before it"),
            (m.LaneRunGraph(3, lane, encoded.tasks, ["nope"]), "not in the graph: ['nope']"),
            (m.LaneRunGraph(4, lane, [], []), "graphs of 1 to 64 tasks, not 0"),
        ):
            answer = channel.exchange(run, lambda: False)
            assert answer is not None
            reply, _ = answer
            assert reply.status == "declined" and reason in reply.reason, reply
        run = m.LaneRunGraph(5, lane, encoded.tasks, encoded.keys, functions)
        answer = channel.exchange(run, lambda: False)
        assert answer is not None
        reply, buffers = answer
        assert reply.status == "finished" and loads_value(reply.payloads[0], buffers) == 6
    finally:
        channel.close()


def test_a_graph_offered_to_a_lane_carries_the_computes_priority(client: Client) -> None:
    """(A graph the lane declines goes to the scheduler as encoded for the lane.)"""
    total = delayed(sum)([delayed(double)(1), delayed(double)(2)])
    tasks, by_type, templates = _materialize(total.__dask_graph__())
    options = {"priority": 3}
    encoded = lane_graph(client, tasks, by_type, templates, [total.key], options)
    assert encoded is not None and [spec.priority for spec in encoded.tasks] == [3, 3, 3]
    assert encoded.keys == [total.key] and encoded.tasks[-1].key == total.key
    for refused in ({"retries": 2}, {"workers": ["x"]}, {"resources": {"GPU": 1}}, {"duration": 5}):
        assert lane_graph(client, tasks, by_type, templates, [total.key], refused) is None
