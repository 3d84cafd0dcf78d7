"""A small graph run whole on a worker's lane thread (``LaneRunGraph``), as Dask's
synchronous scheduler would run it: each task after its dependencies, in the client's
order, each result dropped once its last dependent has run, unless asked for.

The run stops between two tasks when :func:`graph_stop_reason` says so (too long, or
too many bytes held); the client then submits the graph through the scheduler. The
first task that fails ends the run with its error, as it would err every key that
depends on it through the scheduler.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from shoal.core.worker.lanes import GraphLimits, graph_stop_reason
from shoal.core.worker.state import ExecuteFailure, ExecuteSuccess
from shoal.protocol import messages as m
from shoal.server.task_thread import running_by_lane

if TYPE_CHECKING:
    from shoal.server.worker import Worker


class GraphRun:
    """What came of a graph's run: the values asked for, or the failure, or why it
    stopped; and each task that ran (for the scheduler's report)."""

    __slots__ = ("values", "failure", "stopped", "ran")

    def __init__(self) -> None:
        self.values: list[Any] = []  # of the keys asked for, in their order
        self.failure: ExecuteFailure | None = None
        self.stopped = ""
        self.ran: list[m.LaneRan] = []  # (lane filled in), in the order they ran


def run_graph(worker: Worker, msg: m.LaneRunGraph, limits: GraphLimits) -> GraphRun:
    """Run ``msg.tasks`` on this thread (the worker's rule has checked their order)."""
    out = GraphRun()
    wanted = set(msg.keys)
    uses = Counter(dep for task in msg.tasks for dep in task.deps)
    results: dict[m.Key, Any] = {}
    sizes: dict[m.Key, int] = {}
    held = 0
    began = time.monotonic()
    output = worker._output
    # Everything the graph writes is reported under the first key asked for: the one
    # the caller's get shows and re-raises warnings of.
    output_key = msg.keys[0]
    for task in msg.tasks:
        if out.ran:
            stop = graph_stop_reason(limits, time.monotonic() - began, held)
            if stop:
                out.stopped = stop
                return out
        if output is not None:
            output.begin(output_key)
        try:
            with running_by_lane(worker, task.key):
                result = worker._run_one(task.key, task.func, task.payload, results.__getitem__, [])
        finally:
            if output is not None:
                output.end(output_key)
        if type(result) is not ExecuteSuccess:
            assert type(result) is ExecuteFailure
            out.ran.append(m.LaneRan(msg.lane, task.key, "erred", result.start, result.stop))
            out.failure = result
            return out
        out.ran.append(
            m.LaneRan(msg.lane, task.key, "memory", result.start, result.stop, result.nbytes)
        )
        if uses[task.key] or task.key in wanted:  # (else nothing needs it: let go now)
            results[task.key] = result.value
            sizes[task.key] = result.nbytes
            held += result.nbytes
        del result
        for dep in task.deps:  # a dependency's last dependent has run: it goes
            uses[dep] -= 1
            if not uses[dep] and dep not in wanted:
                del results[dep]
                held -= sizes.pop(dep)
    out.values = [results[key] for key in msg.keys]
    return out
