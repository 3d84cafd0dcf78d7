"""A large graph goes to the scheduler part by part as the client encodes it
(``SubmitTasks(more=True)``): the parts arrive in submission order, each as soon as it
is encoded; a part that fails to encode, or a scheduler lost mid-graph, ends the
compute with a clear error and leaves nothing half-submitted behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import pytest
from recording_scheduler import on_a_loop_thread, wait_for

from shoal import Client
from shoal.client.graph import collections
from shoal.client.graph.dask_graph import GraphEncoder
from shoal.protocol import messages as m
from shoal.server.scheduler import Scheduler

PART = 7  # tasks per part in these tests


class PartsScheduler(Scheduler):
    """A real scheduler that records each ``SubmitTasks`` as it arrives."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1", 0, validate=True)
        self.parts: list[m.SubmitTasks] = []
        self.arrived = threading.Condition()

    def _client_batch(self, client_id: str, batch: list[m.Message]) -> None:
        with self.arrived:
            self.parts.extend(msg for msg in batch if type(msg) is m.SubmitTasks)
            self.arrived.notify_all()
        super()._client_batch(client_id, batch)

    def held(self) -> int:
        return len(self.state.tasks)


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collections, "PART_SIZE", PART)


@pytest.fixture
def submitted_order(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The keys in the order ``submission_order`` gave them, per graph."""
    orders: list[list[Any]] = []
    original = collections.submission_order

    def recording(*args: Any) -> list[Any]:
        out = original(*args)
        orders.append(list(out))
        return out

    monkeypatch.setattr(collections, "submission_order", recording)
    return orders


def hold_encoding_at(
    monkeypatch: pytest.MonkeyPatch, nth: int, action: Callable[[], None]
) -> threading.Event:
    """Run ``action`` in the client's thread just before it encodes its ``nth`` task."""
    original = GraphEncoder.task_spec
    count = [0]
    done = threading.Event()

    def task_spec(self: GraphEncoder, *args: Any, **kwargs: Any) -> m.TaskSpec:
        count[0] += 1
        if count[0] == nth:
            action()
            done.set()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GraphEncoder, "task_spec", task_spec)
    return done


@pytest.mark.timeout(60)
def test_parts_arrive_in_submission_order_while_the_client_still_encodes(
    small_parts: None, submitted_order: list[list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    x = (da.ones((40,), chunks=1) + 1).sum()  # ~55 tasks: 8 parts
    with on_a_loop_thread(PartsScheduler(), "parts-scheduler") as s:

        def first_part_arrived() -> None:
            # The client is about to encode its third part: the first must already be
            # at the scheduler (sent as soon as encoded, not after the whole graph).
            with s.arrived:
                assert s.arrived.wait_for(lambda: len(s.parts) >= 1, timeout=20)
            arrived_early.append(len(s.parts))

        arrived_early: list[int] = []
        with Client(s.address, timeout=30) as client:
            hold_encoding_at(monkeypatch, 2 * PART + 1, first_part_arrived)
            future = client.compute(x)
            (order,) = submitted_order
            wait_for(lambda: s.held() >= len(order), 20, "the scheduler to hold the graph")
            parts = [p for p in s.parts if p.stimulus_id == s.parts[0].stimulus_id]
            assert arrived_early and arrived_early[0] < len(parts)
            assert [spec.key for p in parts for spec in p.tasks] == order
            assert all(len(p.tasks) == PART for p in parts[:-1])
            assert [p.more for p in parts] == [True] * (len(parts) - 1) + [False]
            assert [p.wanted for p in parts[:-1]] == [[]] * (len(parts) - 1)
            assert parts[-1].wanted == [future.key]
            del future


@pytest.mark.timeout(60)
def test_a_part_that_fails_to_encode_errs_the_compute_and_leaves_nothing_behind(
    small_parts: None, submitted_order: list[list[Any]]
) -> None:
    lock = threading.Lock()  # cannot be pickled: its task cannot be encoded

    def use(a: Any, b: Any) -> Any:
        return a

    x = (da.ones((40,), chunks=1) + 1).sum()
    bad = dask.delayed(use)(x, dask.delayed(lock))
    with (
        on_a_loop_thread(PartsScheduler(), "parts-scheduler") as s,
        Client(s.address, timeout=30) as client,
    ):
        with pytest.raises(Exception, match="(?i)lock|pickle|serial"):
            client.compute(bad)
        (order,) = submitted_order
        # the client ends what it sent with an empty part that wants nothing
        wait_for(lambda: s.parts and not s.parts[-1].more, 20, "the graph's last part")
        graph_parts = [p for p in s.parts if p.stimulus_id == s.parts[0].stimulus_id]
        assert len(graph_parts) >= 2, "the failure was expected after parts were sent"
        assert 0 < sum(len(p.tasks) for p in graph_parts) < len(order)  # half-sent
        # the graph is given up on: nothing of it stays in the scheduler
        wait_for(lambda: s.held() == 0, 20, "the scheduler to drop the graph")
        assert graph_parts[-1].tasks == [] and graph_parts[-1].wanted == []
        assert not graph_parts[-1].more
        # and the client goes on working
        ok = client.compute((da.ones((10,), chunks=5) + 1).sum())
        wait_for(lambda: s.held() > 0, 20, "the next graph to arrive")
        del ok


@pytest.mark.timeout(60)
def test_a_scheduler_lost_mid_graph_stops_the_encoding_with_a_clear_error(
    small_parts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = (da.ones((60,), chunks=1) + 1).sum()  # ~80 tasks: 12 parts
    encoded = [0]
    with (
        on_a_loop_thread(PartsScheduler(), "parts-scheduler") as s,
        Client(s.address, timeout=30) as client,
    ):

        def lose_the_scheduler() -> None:
            with s.arrived:
                assert s.arrived.wait_for(lambda: len(s.parts) >= 1, timeout=20)
            client._call_in_loop(lambda: client._conn.abort("cut by the test"))  # type: ignore[union-attr]
            deadline = time.monotonic() + 20
            while client.status == "running":  # the client notices
                assert time.monotonic() < deadline
                time.sleep(0.01)

        hold_encoding_at(monkeypatch, 2 * PART + 1, lose_the_scheduler)
        monkeypatch.setattr(GraphEncoder, "task_spec", _chain(GraphEncoder.task_spec, encoded))
        with pytest.raises(RuntimeError, match="not sent in full"):
            client.compute(x)
        # at most the part being encoded when it was lost is finished, not the rest
        assert encoded[0] <= 3 * PART


def _chain(inner: Callable[..., Any], counter: list[int]) -> Callable[..., Any]:
    def task_spec(self: GraphEncoder, *args: Any, **kwargs: Any) -> m.TaskSpec:
        counter[0] += 1
        return inner(self, *args, **kwargs)

    return task_spec
