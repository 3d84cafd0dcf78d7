"""The worker's side of lanes: run a client's one-task get, or small graph, and answer
the client.

A lane's task runs apart from the worker's state machine (it has no record there, nor
on the scheduler): on the loop when the loop-task rule allows it
(``shoal/server/loop_tasks.py``), else on a thread kept for lane runs, so that it never
waits behind the scheduler's tasks nor they behind it. Whether the worker takes a run
is decided by ``shoal/core/worker/lanes.py`` (only when idle, one at a time); a declined
run is submitted by the client through the scheduler instead. A run on the thread that
goes on past ``BUSY_AFTER`` is announced to the scheduler (``LaneBusy``), which counts a
thread of this worker busy until the run's report.

A small graph (``LaneRunGraph``) always runs on the lane thread (``_graph_run.py``),
when the rule also finds it short by the prefixes' durations: those the scheduler
shares (``LaneDurations``), updated by the graphs run here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

from shoal import config
from shoal._durations import parse_duration
from shoal.core.worker.lanes import (
    GraphLimits,
    LaneFacts,
    graph_decline_reason,
    lane_decline_reason,
    task_prefix,
)
from shoal.core.worker.state import ExecuteFailure, ExecuteSuccess
from shoal.lanes._graph_run import GraphRun, run_graph
from shoal.protocol import messages as m
from shoal.protocol.framing import ProtocolError
from shoal.protocol.serialize import (
    SerializationError,
    dumps_exception,
    dumps_value,
    loads_task_args,
)
from shoal.server.loop_tasks import runs_on_loop
from shoal.server.task_thread import running_by_lane

if TYPE_CHECKING:
    from shoal.comm.connection import Connection
    from shoal.server.worker import Worker

logger = logging.getLogger("shoal.lanes")

_NO_DEPENDENCIES: dict[Any, Any] = {}  # a lane task's arguments name no other key
# Runs are reported to the scheduler this long after the first unreported one, together:
# the scheduler is not woken while the client takes its answer (on a small machine they
# would share a CPU), and a burst of gets costs it one frame.
REPORT_DELAY = 0.01
# A run on the lane thread still going after this long is announced to the scheduler
# (LaneBusy), which then counts a thread of this worker busy until the run's report.
BUSY_AFTER = 0.05


class WorkerLanes:
    """The lanes the scheduler opened on this worker, and the runs under them."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.open: dict[str, str] = {}  # lane -> its client's id
        self.durations: dict[str, float] = {}  # recent seconds per task prefix
        self.graph_limits = graph_limits()
        self.running = 0  # lane runs not answered yet (0 or 1)
        self.runs = 0  # lane runs answered, declines not counted
        self.declined = 0
        self.graph_runs = 0  # of ``runs``, graphs
        self.graphs_stopped = 0  # graphs that stopped part way (too long, too large)
        self._queue: _RunQueue | None = None
        self._thread: threading.Thread | None = None
        self._reports: list[m.LaneRan] = []  # runs answered, not reported yet
        self._report_timer: asyncio.TimerHandle | None = None
        self._busy_timer: asyncio.TimerHandle | None = None  # a thread run's LaneBusy

    # ------------------------------------------------------------------ the scheduler

    def on_scheduler(self, msg: m.LaneOpen | m.LaneClosed | m.LaneDurations) -> None:
        if type(msg) is m.LaneOpen:
            self.open[msg.lane] = msg.client
        elif type(msg) is m.LaneClosed:
            self.open.pop(msg.lane, None)
        else:
            assert type(msg) is m.LaneDurations
            self.durations.update(msg.durations)

    # ------------------------------------------------------------------ a client's run

    def on_run(self, conn: Connection, msg: m.LaneRun) -> None:
        reason = self._decline_reason(msg)
        if reason:
            self.declined += 1
            conn.send(m.LaneResult(msg.request_id, "declined", reason=reason))
            conn.flush()
            return
        worker = self.worker
        if msg.functions:
            worker.functions.add(msg.functions)
        task = msg.task
        self.running += 1
        func = worker._loaded_functions.get(task.func) if worker.tiny_tasks_on_loop else None
        if runs_on_loop(  # (False at once unless ``func`` is an allow-listed builtin)
            func, task.payload, (), lambda dts: False, lambda: _load_arguments(worker, task)
        ):
            worker.loop_task_count += 1
            self._answer(conn, msg, self._run(task))
            return
        self._on_thread(conn, msg, task.key)

    def on_run_graph(self, conn: Connection, msg: m.LaneRunGraph) -> None:
        worker = self.worker
        reason = graph_decline_reason(
            worker.state,
            msg.tasks,
            msg.keys,
            self.durations,
            self.graph_limits,
            self._facts(msg.lane),
        )
        if reason:
            self.declined += 1
            conn.send(m.LaneResult(msg.request_id, "declined", reason=reason))
            conn.flush()
            return
        if msg.functions:
            worker.functions.add(msg.functions)
        self.running += 1
        self._on_thread(conn, msg, msg.tasks[0].key)

    def _on_thread(self, conn: Connection, msg: m.LaneRun | m.LaneRunGraph, first: m.Key) -> None:
        """Run ``msg`` on the lane thread; announced busy if it goes on (LaneBusy,
        naming ``first``, the task its report names first)."""
        if self._queue is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run_thread, name="shoal-lane", daemon=True)
            self._thread.start()
        self._queue.put((conn, msg))
        loop = self.worker._loop
        if loop is not None:  # a run that goes on counts as a busy thread (LaneBusy)
            self._busy_timer = loop.call_later(BUSY_AFTER, self._announce, msg.lane, first)

    def _decline_reason(self, msg: m.LaneRun) -> str:
        return lane_decline_reason(self.worker.state, msg.task, self._facts(msg.lane))

    def _facts(self, lane: str) -> LaneFacts:
        """What the rules of ``shoal/core/worker/lanes.py`` know of this worker."""
        worker = self.worker
        return LaneFacts(
            lane,
            lane_open=lane in self.open,
            running=self.running,
            leaving=worker._closed.is_set() or bool(worker.leaving),
            limited=worker.lifetime.limited,
            watched=worker.plugins.watching,
        )

    def _run_thread(self) -> None:
        assert self._queue is not None
        worker = self.worker
        while True:
            item = self._queue.get()
            if item is None:
                return
            conn, msg = item
            loop = worker._loop
            if type(msg) is m.LaneRunGraph:
                graph = run_graph(worker, msg, self.graph_limits)
                if loop is None or loop.is_closed():
                    return
                loop.call_soon_threadsafe(self._answer_graph, conn, msg, graph)
                del graph
            else:
                assert type(msg) is m.LaneRun
                result = self._run(msg.task, on_thread=True)
                if loop is None or loop.is_closed():
                    return
                loop.call_soon_threadsafe(self._answer, conn, msg, result)
                del result
            del conn, msg, item

    def _run(self, task: m.TaskSpec, on_thread: bool = False) -> ExecuteSuccess | ExecuteFailure:
        """The same method as a task thread's run: the same result, error and times."""
        worker = self.worker
        output = worker._output
        as_task = running_by_lane(worker, task.key) if on_thread else contextlib.nullcontext()
        if output is not None:
            output.begin(task.key)
        try:
            with as_task:
                return worker._run_one(
                    task.key, task.func, task.payload, _NO_DEPENDENCIES.__getitem__, []
                )
        finally:
            if output is not None:
                output.end(task.key)

    def _announce(self, lane: str, first: m.Key) -> None:
        """A run has gone on for BUSY_AFTER: the scheduler counts a thread of this
        worker busy until the LaneRan of ``first`` (which follows on the same
        connection; a graph's reports all go together at its end)."""
        self._busy_timer = None
        scheduler = self.worker.scheduler
        if scheduler is not None:
            scheduler.send(m.LaneBusy(lane, first))

    def _answer_graph(self, conn: Connection, msg: m.LaneRunGraph, graph: GraphRun) -> None:
        """Answer the client with the values asked for (or the failure, or a decline if
        the run stopped part way), then report each task that ran."""
        self._end_run()
        output = self.worker._output
        printed = output.take_task(msg.keys[0]) if output is not None else b""
        buffers: list[memoryview] = []
        if graph.stopped:
            self.declined += 1
            self.graphs_stopped += 1
            reply = m.LaneResult(
                msg.request_id, "declined", reason=graph.stopped, output=printed, too_long=True
            )
        else:
            self.runs += 1
            self.graph_runs += 1
            if graph.failure is not None:
                reply = _erred(msg.request_id, graph.failure, printed)
            else:
                what = "a result of the graph"
                reply, buffers = _finished(msg.request_id, graph.values, printed, what)
        graph.values = []
        self._send(conn, reply, buffers, "a result of the graph")
        self._learn(msg.tasks, graph.ran)
        self._reports.extend(graph.ran)
        self._schedule_report()

    def _learn(self, tasks: list[m.TaskSpec], ran: list[m.LaneRan]) -> None:
        """Each task that finished updates its prefix's recent duration, as the
        scheduler's would (halved in weight at each new one)."""
        durations = self.durations
        for task, report in zip(tasks, ran):
            if report.status == "memory":
                prefix = task_prefix(task)
                seconds = report.stop - report.start
                old = durations.get(prefix)
                durations[prefix] = seconds if old is None else (old + seconds) / 2

    def _answer(
        self, conn: Connection, msg: m.LaneRun, result: ExecuteSuccess | ExecuteFailure
    ) -> None:
        """Answer the client first, then tell the scheduler (off the client's path)."""
        self._end_run()
        self.runs += 1
        key = msg.task.key
        output = self.worker._output
        printed = output.take_task(key) if output is not None else b""
        buffers: list[memoryview] = []
        status, nbytes = "erred", 0
        if type(result) is ExecuteSuccess:
            what = f"the result of {key!r}"
            reply, buffers = _finished(
                msg.request_id, [result.value], printed, what, result.type_name
            )
            if reply.status == "finished":
                status, nbytes = "memory", result.nbytes
        else:
            assert type(result) is ExecuteFailure
            reply = _erred(msg.request_id, result, printed)
        start, stop = result.start, result.stop
        del result
        if not self._send(conn, reply, buffers, f"the result of {key!r}"):
            status, nbytes = "erred", 0
        self._reports.append(m.LaneRan(msg.lane, key, status, start, stop, nbytes))
        self._schedule_report()

    def _end_run(self) -> None:
        if self._busy_timer is not None:
            self._busy_timer.cancel()
            self._busy_timer = None
        self.running -= 1

    def _send(
        self, conn: Connection, reply: m.LaneResult, buffers: list[memoryview], what: str
    ) -> bool:
        """Send ``reply``; if it cannot be framed (e.g. more buffers than a frame may
        carry), an error saying so instead, and False."""
        try:
            conn.send(reply, buffers)
            conn.flush()
            return True
        except ProtocolError as e:
            exc = SerializationError(f"{what} cannot be sent: {e}")
            conn.send(m.LaneResult(reply.request_id, "erred", exception=dumps_exception(exc)))
            conn.flush()
            return False

    def _schedule_report(self) -> None:
        loop = self.worker._loop
        if self._report_timer is None and loop is not None and self._reports:
            self._report_timer = loop.call_later(REPORT_DELAY, self._report)

    def _report(self) -> None:
        """Tell the scheduler of the runs since the last report, in one frame."""
        self._report_timer = None
        reports, self._reports = self._reports, []
        scheduler = self.worker.scheduler
        if scheduler is not None:
            for report in reports:
                scheduler.send(report)

    def close(self) -> None:
        self.open.clear()
        if self._busy_timer is not None:
            self._busy_timer.cancel()
        if self._report_timer is not None:
            self._report_timer.cancel()
            self._report()
        if self._queue is not None:
            self._queue.put(None)


def _finished(
    request_id: int, values: list[Any], printed: bytes, what: str, type_name: str = ""
) -> tuple[m.LaneResult, list[memoryview]]:
    """The answer carrying ``values`` and their buffers; if one cannot be serialised, an
    error saying so (``what``: the values, for the message) and no buffers."""
    payloads: list[m.Payload] = []
    buffers: list[memoryview] = []
    try:
        for value in values:
            payload, more = dumps_value(value)
            payloads.append(payload)
            buffers.extend(more)
    except SerializationError as e:
        exc = SerializationError(f"{what} cannot be sent: {e}")
        return m.LaneResult(request_id, "erred", exception=dumps_exception(exc), output=printed), []
    reply = m.LaneResult(
        request_id, "finished", payloads=payloads, type_name=type_name, output=printed
    )
    return reply, buffers


def _erred(request_id: int, failure: ExecuteFailure, printed: bytes) -> m.LaneResult:
    return m.LaneResult(
        request_id,
        "erred",
        exception=failure.exception,
        traceback=failure.traceback,
        output=printed,
    )


def graph_limits() -> GraphLimits:
    """``shoal.worker.lane-graphs``, checked once per worker."""
    from dask.utils import parse_bytes

    name = "shoal.worker.lane-graphs"
    expected = parse_duration(
        config.get("worker.lane-graphs.expected"), f"{name}.expected", allow_zero=True
    )
    stop_after = parse_duration(config.get("worker.lane-graphs.stop-after"), f"{name}.stop-after")
    value = config.get("worker.lane-graphs.max-bytes")
    try:
        max_bytes = parse_bytes(value) if isinstance(value, str) else value
    except ValueError:
        max_bytes = None
    if type(max_bytes) is not int or max_bytes < 0:
        raise ValueError(
            f"{name}.max-bytes must be a number of bytes (e.g. '256MiB'), not {value!r}"
        )
    return GraphLimits(expected, stop_after, max_bytes)


_RunQueue = queue.SimpleQueue[tuple["Connection", m.LaneRun | m.LaneRunGraph] | None]


def _load_arguments(worker: Worker, task: m.TaskSpec) -> Any:
    return loads_task_args(task.payload, _NO_DEPENDENCIES.__getitem__, worker._function)
